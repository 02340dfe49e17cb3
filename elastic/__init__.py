"""Elastic PyTorch training on etcd v3."""
