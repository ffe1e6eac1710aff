"""Placement strategies and split() (installed as graphflow.partitioners); see the issue on
model parallelism. Empty until then."""
