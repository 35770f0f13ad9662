"""``--track``: TensorBoard, MLflow and W&B runs logged from rank 0."""
