"""client-go style machinery: what every controller needs and where no decision about a job lives.

An informer (list + watch into a cache), a rate-limited work queue, leader election through a Kubernetes
Lease (`lease_election`) and through etcd (`etcd_election`), and the two combined into the Kubernetes
controller's fenced right to act (`kube_leadership`). What to do with a job is `controller/reconcile.py`'s.
"""
