"""Sharded parameter server: parameters sliced across shards, updated where they live."""
