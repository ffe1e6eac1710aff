"""speech-mlp, DistBelief's fully connected speech model: 440 -> 4 x 2560 sigmoid -> 8192."""

from math import prod

import graphflow as gf

model = gf.models.speech_mlp(batch=64)
params = model.graph.parameters()
print(f"{model.name}: {sum(prod(p.shape) for p in params):,} parameters")

data = gf.datasets.synthetic((440,), classes=8192, n=256)
trainer = gf.Trainer(model, gf.optim.Adagrad(0.001))  # 0.01 saturates the sigmoids
trainer.fit(gf.datasets.batches(data.x_train, data.y_train, 64), steps=5)
