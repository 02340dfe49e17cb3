#!/bin/sh
# Makes what etcd.yaml, the etcd-auth Job and controller.yaml read from Secrets, with openssl only:
#
#   sh manifests/etcd-secrets.sh DIR [NAMESPACE]      # NAMESPACE: where etcd runs (default elastic-system)
#   kubectl apply -f DIR/secrets.yaml                 # before (or right after) `kubectl apply -k manifests/`
#
# DIR gets a CA (ca.crt, ca.key: keep the key offline, it signs every certificate below), and
#   etcd-server-tls   etcd's certificate for clients: etcd-client.NS.svc, every member, localhost
#   etcd-peer-tls     the members' certificate to each other (CN etcd-peer, etcd --peer-cert-allowed-cn)
#   etcd-client-tls   a client certificate (CN elastic-client) for the controller and the etcd-auth Job
# and worker.crt/worker.key, the client certificate of the workers' agents (etcd-tenant.sh puts it in each
# namespace's worker Secret): it has no CommonName, since agents and training processes reach etcd through
# its HTTP gateway, which refuses a certificate with one when auth is on (README, "TLS and auth").
#   etcd-root                 password of etcd's root user
#   elastic-controller-etcd   username and password of the controller's etcd user
# as Secret manifests in DIR/secrets.yaml (the TLS ones in cert-manager's layout: ca.crt, tls.crt, tls.key;
# Certificates issued by cert-manager under the same Secret names work as well). Passwords are random.
# A client certificate's CN is deliberately no etcd user: etcd would take it as that user, password unasked.
set -eu
dir=${1:?usage: etcd-secrets.sh DIR [NAMESPACE]}
ns=${2:-elastic-system}
days=${DAYS:-825}
umask 077
mkdir -p "$dir"
cd "$dir"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }

# cert NAME CN|/SUBJECT EXTENDED_KEY_USAGE [SUBJECT_ALT_NAMES]
cert() {
  key "$1"
  case $2 in /*) subject=$2 ;; *) subject="/CN=$2" ;; esac
  openssl req -new -key "$1.key" -subj "$subject" -out "$1.csr"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$3"
    if [ -n "${4:-}" ]; then echo "subjectAltName=$4"; fi
  } >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" -sha256 \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

if [ ! -f ca.key ]; then
  key ca
  openssl req -x509 -new -key ca.key -subj "/CN=elastic-etcd-ca" -days "$days" -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.crt
fi
members="DNS:*.etcd.$ns.svc,DNS:*.etcd.$ns.svc.cluster.local,DNS:etcd.$ns.svc,DNS:etcd.$ns.svc.cluster.local"
# serverAuth and clientAuth: etcd's own gRPC gateway dials etcd with this certificate.
cert server etcd-server serverAuth,clientAuth \
  "DNS:etcd-client.$ns.svc,DNS:etcd-client.$ns.svc.cluster.local,DNS:etcd-client,$members,DNS:localhost,IP:127.0.0.1"
cert peer etcd-peer serverAuth,clientAuth "$members"
cert client elastic-client clientAuth
cert worker /O=elastic-worker clientAuth

b64() { base64 <"$1" | tr -d '\n'; }
rand() { openssl rand -hex 24 | tr -d '\n' >"$1"; }
[ -f root.password ] || rand root.password
[ -f controller.password ] || rand controller.password
printf 'elastic-controller' >controller.username

tls_secret() {
  printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: %s\n' "$1" "$ns"
  printf 'type: kubernetes.io/tls\ndata:\n  ca.crt: %s\n  tls.crt: %s\n  tls.key: %s\n' \
    "$(b64 ca.crt)" "$(b64 "$2.crt")" "$(b64 "$2.key")"
}
{
  tls_secret etcd-server-tls server
  tls_secret etcd-peer-tls peer
  tls_secret etcd-client-tls client
  printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: etcd-root\n  namespace: %s\n' "$ns"
  printf 'type: Opaque\ndata:\n  password: %s\n' "$(b64 root.password)"
  printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: elastic-controller-etcd\n  namespace: %s\n' "$ns"
  printf 'type: Opaque\ndata:\n  username: %s\n  password: %s\n' "$(b64 controller.username)" "$(b64 controller.password)"
} >secrets.yaml
echo "wrote $dir/secrets.yaml (Secrets in namespace $ns); keep $dir/ca.key offline"
