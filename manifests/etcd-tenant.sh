#!/bin/sh
# One namespace's etcd tenancy: the workers of that namespace's ElasticJobs get an etcd user whose role reads
# and writes /elastic/jobs/NAMESPACE/ only (no other namespace's jobs, no controller key), and the Secret the
# worker pods mount (ELASTIC_WORKER_ETCD_SECRET, `elastic-etcd-worker` in controller.yaml):
#
#   ETCDCTL_ENDPOINTS=... ETCDCTL_CACERT=... ETCDCTL_CERT=... ETCDCTL_KEY=... ETCDCTL_USER=root:PASSWORD \
#     sh manifests/etcd-tenant.sh NAMESPACE DIR     # DIR: what etcd-secrets.sh made (ca.crt, worker.crt/.key)
#   kubectl apply -f DIR/worker-NAMESPACE.yaml
#
# Run it again to rotate the password (the role and user are kept, the password replaced). The user name is
# elastic-ns-NAMESPACE; the client certificate is etcd-secrets.sh's worker certificate, which has no CommonName:
# agents and training processes reach etcd through its HTTP gateway, which refuses one with a CommonName when
# auth is on (and etcd would take a certificate named after a user as that user, password unasked).
set -eu
ns=${1:?usage: etcd-tenant.sh NAMESPACE DIR}
dir=${2:?usage: etcd-tenant.sh NAMESPACE DIR}
name="elastic-ns-$ns"
password=$(openssl rand -hex 24)

etcdctl role get "$name" >/dev/null 2>&1 || etcdctl role add "$name" >/dev/null
etcdctl role grant-permission "$name" --prefix=true readwrite "/elastic/jobs/$ns/" >/dev/null
if etcdctl user get "$name" >/dev/null 2>&1; then
  printf '%s\n' "$password" | etcdctl user passwd "$name" --interactive=false >/dev/null
else
  printf '%s\n' "$password" | etcdctl user add "$name" --interactive=false >/dev/null
fi
etcdctl user grant-role "$name" "$name" >/dev/null

b64() { base64 <"$1" | tr -d '\n'; }
umask 077
cat >"$dir/worker-$ns.yaml" <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: elastic-etcd-worker
  namespace: $ns
type: Opaque
stringData:
  username: $name
  password: $password
data:
  ca.crt: $(b64 "$dir/ca.crt")
  tls.crt: $(b64 "$dir/worker.crt")
  tls.key: $(b64 "$dir/worker.key")
EOF
echo "etcd user $name may use /elastic/jobs/$ns/ only; wrote $dir/worker-$ns.yaml"
