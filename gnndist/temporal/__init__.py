"""Temporal link prediction: node state, models, negatives and metrics, the trainer."""
