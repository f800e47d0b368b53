"""Static node classification: models and the trainer."""
