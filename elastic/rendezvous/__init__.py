"""Rendezvous on etcd v3: the round protocol, its executor, and the torchrun handler (`etcd-v3`)."""
