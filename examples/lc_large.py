"""lc-large, DistBelief's locally connected image model scaled to one machine: build it, print
its parameter count and the shapes of its layers, and take a few training steps."""

from math import prod

import graphflow as gf

model = gf.models.lc_large(batch=64)
params = model.graph.parameters()
print(f"{model.name}: {len(model.graph)} nodes, {sum(prod(p.shape) for p in params):,} parameters")
for p in params:
    print(f"  {p.name:8s} {p.shape}")

data = gf.datasets.synthetic((3, 64, 64), classes=10, n=256)
trainer = gf.Trainer(model, gf.optim.SGD(0.002))
trainer.fit(gf.datasets.batches(data.x_train, data.y_train, 64), steps=5)
