"""Train digits-lc (conv -> pool -> locally connected -> dense) on scikit-learn's digits.

    python examples/train_digits.py            # about a minute on one core
"""

import time

import graphflow as gf

model = gf.models.digits_lc()
print(model.graph)
data = gf.datasets.digits(size=32)
trainer = gf.Trainer(model, gf.optim.Adagrad(0.03))

start = time.perf_counter()
trainer.fit(gf.datasets.batches(data.x_train, data.y_train, 32, seed=0, shift=2), steps=1500)
print(f"trained in {time.perf_counter() - start:.1f} s; "
      f"test accuracy {100 * trainer.accuracy(data.x_test, data.y_test):.2f}%")
