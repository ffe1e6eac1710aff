"""Data parallelism: replicas of a (partitioned) model sharing parameters through the PS."""
