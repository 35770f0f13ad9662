"""Holds its workers for ARGS[0] seconds (default 1) and trains nothing: a job that occupies the cluster."""
import time


def train(ctx):
    time.sleep(float(ctx.args[0]) if ctx.args else 1.0)
