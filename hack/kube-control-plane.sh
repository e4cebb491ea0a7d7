#!/usr/bin/env bash
# A real Kubernetes control plane on loopback, for tests: kube-apiserver 1.20.2 + etcd 3.4 (+ kube-controller-manager,
# which creates the default ServiceAccounts pods need). No scheduler, no kubelet: pods stay Pending, but every
# admission step is real — webhook registration and caBundle TLS, JSONPatch applied by the apiserver, the Priority
# plugin, ResourceQuota, RBAC, TokenRequest/TokenReview (with pod-name/pod-uid extras), SubjectAccessReview, watches.
#
#   kube-control-plane.sh up      start it (builds or unpacks the binaries first if needed); prints shell exports
#   kube-control-plane.sh down    stop what `up` started (only the PIDs it recorded)
#   kube-control-plane.sh env     print the exports again
#   kube-control-plane.sh build   only get the binaries into $KUBE_CP_DIR/bin (`make kube-binaries`)
#
# The project's copy of the team's shared ../shared/kube/control-plane.sh (same interface, same build), plus
# `build`; the test layer tests/cluster uses either (docs/kubernetes.md, "The cluster layer").
#
# Settings (environment): KUBE_CP_DIR (default /tmp/kube-cp), KUBE_CP_API_PORT / KUBE_CP_ETCD_PORT (default: free
# ports), KUBE_CP_KCM=1|0, KUBE_CP_FRESH=1 (wipe etcd data on up).
# The exports: KUBECONFIG (admin, client cert), KUBE_CP_SERVER, KUBE_CP_CA (the cluster CA: sign a webhook's
# serving cert with KUBE_CP_CA_KEY, or use your own CA in the caBundle), KUBE_CP_ADMIN_TOKEN.
#
# Binaries: $KUBE_CP_DIR/bin, else .xz files in bin/ beside this script (the shared copy ships them; this
# repository commits none), else built from Debian bookworm's source package kubernetes
# 1.20.5+really1.20.2-1.1+deb12u1 — the full upstream tree with vendor/ — with bookworm's Go 1.19 (about
# 12 minutes on 2 cores, as root for apt-get; two fixes, see build()).
#
# What 1.20 does NOT have (it drops these fields silently, so a test must not claim them): native sidecar
# containers (initContainers[].restartPolicy: Always), webhook matchConditions, fieldValidation=Strict,
# policy/v1 Eviction (policy/v1beta1 works), ValidatingAdmissionPolicy, projected tokens mounted by default.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
D=${KUBE_CP_DIR:-/tmp/kube-cp}
BIN=$D/bin PKI=$D/pki RUN=$D/run LOG=$D/logs
mkdir -p "$BIN" "$PKI" "$RUN" "$LOG"

apt_install() { # a fresh machine may have no package lists yet
  apt-get install -y -q "$@" >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q "$@" >/dev/null; }
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

stop_all() {
  for n in kube-controller-manager kube-apiserver etcd; do
    f=$RUN/$n.pid
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "$n"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do [ -d "/proc/$pid" ] || break; sleep 0.2; done
      [ -d "/proc/$pid" ] && kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
  done
}

print_env() {
  [ -f "$RUN/env" ] || { echo "control plane not started (run: $0 up)" >&2; exit 1; }
  cat "$RUN/env"
}

case "${1:-}" in
  down) stop_all; exit 0 ;;
  env) print_env; exit 0 ;;
  up|build) ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac

build() { # build from Debian bookworm's source package; needs root for apt-get
  local src=$D/src/kubernetes-1.20.2 apt=$D/apt
  apt_install golang-go build-essential
  if [ ! -d "$src/vendor" ]; then
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$D/src"
    cat > "$apt/bookworm-src.sources" <<'EOF'
Types: deb deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    local O="-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=$apt -o Dir::State::Lists=$apt/lists -o Dir::Cache=$apt/cache"
    apt-get $O update -q >/dev/null
    (cd "$D/src" && apt-get $O source --download-only kubernetes=1.20.5+really1.20.2-1.1+deb12u1 >/dev/null &&
       tar xzf kubernetes_1.20.5+really1.20.2.orig.tar.gz &&
       apt-get $O download golang-github-modern-go-reflect2-dev >/dev/null)
  fi
  mkdir -p "$D/gopath/src/k8s.io" "$D/gotmp"
  ln -sfn "$src" "$D/gopath/src/k8s.io/kubernetes"
  (
    export GOTMPDIR=$D/gotmp GOPATH=$D/gopath GOCACHE=$D/gocache GO111MODULE=off GOFLAGS= GOPROXY=off CGO_ENABLED=0
    cd "$D/gopath/src/k8s.io/kubernetes"
    # Fix 1: vendored modern-go/reflect2 v1.0.1 breaks on Go >= 1.18 (SIGSEGV in UnsafeMapType.UnsafeIterate as soon
    # as a webhook returns a patch); use bookworm's v1.0.2.
    R=vendor/github.com/modern-go/reflect2
    if [ ! -f $R/go_above_118.go ]; then
      rm -rf "$D/src/reflect2" && dpkg-deb -x "$D"/src/golang-github-modern-go-reflect2-dev_1.0.2*.deb "$D/src/reflect2"
      rm -f $R/*.go $R/*.s
      cp "$D"/src/reflect2/usr/share/gocode/src/github.com/modern-go/reflect2/*.{go,s} $R/
    fi
    # Fix 2: pkg/generated/openapi/zz_generated.openapi.go is generated upstream and absent from the tarball.
    if [ ! -f pkg/generated/openapi/zz_generated.openapi.go ]; then
      go build -o "$D/gotmp/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
      dirs=$(find -H . \( -not \( \( -path ./_\* -o -path ./.\* -o -path ./vendor \) -prune \) \) -type f -name '*.go' \
              | sed 's|^./staging/src|vendor|; s|/[^/]*$||; s|^./||' | LC_ALL=C sort -u)
      tagfiles=$(find $dirs -maxdepth 1 -type f -name '*.go' | xargs grep -l '^// *+k8s:' \
              | grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/')
      inputs=$(grep -l '+k8s:openapi-gen=' $tagfiles | xargs -n1 dirname | LC_ALL=C sort -u \
              | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)
      "$D/gotmp/openapi-gen" --logtostderr -i "$inputs" -p k8s.io/kubernetes/pkg/generated/openapi \
        -O zz_generated.openapi -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$D/gotmp/violations.report"
    fi
    LD="-s -w"
    for p in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
      LD="$LD -X $p.gitVersion=v1.20.2 -X $p.gitMajor=1 -X $p.gitMinor=20 -X $p.gitTreeState=clean"
    done
    for c in "$@"; do nice -n 10 go build -p 2 -trimpath -ldflags "$LD" -o "$BIN/$c" "./cmd/$c"; done
  )
}

want=(kube-apiserver); [ "${KUBE_CP_KCM:-1}" = 1 ] && want+=(kube-controller-manager)
missing=()
for b in "${want[@]}"; do
  [ -x "$BIN/$b" ] && continue
  if [ -f "$HERE/bin/$b.xz" ]; then xz -dc "$HERE/bin/$b.xz" > "$BIN/$b.tmp" && chmod +x "$BIN/$b.tmp" && mv "$BIN/$b.tmp" "$BIN/$b"
  else missing+=("$b"); fi
done
[ ${#missing[@]} -eq 0 ] || build "${missing[@]}"
[ "$1" = build ] && { ls "$BIN"; exit 0; }
command -v etcd >/dev/null || apt_install etcd-server
command -v openssl >/dev/null || apt_install openssl

if [ ! -f "$PKI/ca.crt" ]; then
  (
    cd "$PKI"
    printf '[req]\ndistinguished_name=dn\n[dn]\n[v3_ca]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign,digitalSignature\n' > ca.cnf
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=kube-cp-ca" \
      -config ca.cnf -extensions v3_ca 2>/dev/null
    leaf() { # name subject extendedKeyUsage [subjectAltName]
      openssl req -new -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      { echo "basicConstraints=CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=$3"; [ -n "${4:-}" ] && echo "subjectAltName=$4"; } > "$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    leaf apiserver "/CN=kube-apiserver" serverAuth "IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    leaf admin "/O=system:masters/CN=kube-admin" clientAuth
    leaf kcm "/CN=system:kube-controller-manager" clientAuth
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    echo "$(openssl rand -hex 24),kube-admin,kube-admin,system:masters" > tokens.csv
    chmod 600 ./*.key tokens.csv
  )
fi
ADMIN_TOKEN=$(cut -d, -f1 "$PKI/tokens.csv")

stop_all
API_PORT=${KUBE_CP_API_PORT:-$(free_port)}
ETCD_PORT=${KUBE_CP_ETCD_PORT:-$(free_port)}
ETCD_PEER_PORT=$(free_port)
wait_for() { local what=$1 t=$2; shift 2
  for _ in $(seq $((t*5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "timed out waiting for $what; logs in $LOG" >&2; return 1; }

[ "${KUBE_CP_FRESH:-1}" = 1 ] && rm -rf "$RUN/etcd-data"
nohup etcd --name kube-cp --data-dir "$RUN/etcd-data" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "kube-cp=http://127.0.0.1:$ETCD_PEER_PORT" > "$LOG/etcd.log" 2>&1 < /dev/null &
echo $! > "$RUN/etcd.pid"
wait_for etcd 30 curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

ISSUER=https://kubernetes.default.svc
nohup "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" --insecure-port=0 \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" --token-auth-file="$PKI/tokens.csv" \
  --service-account-issuer=$ISSUER --api-audiences=$ISSUER \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-cluster-ip-range=10.0.0.0/24 --endpoint-reconciler-type=none --authorization-mode=RBAC,Node \
  --enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultTolerationSeconds,Priority,NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ResourceQuota \
  --allow-privileged=true --profiling=false --v=1 > "$LOG/kube-apiserver.log" 2>&1 < /dev/null &
echo $! > "$RUN/kube-apiserver.pid"
wait_for kube-apiserver 90 curl -fsS --cacert "$PKI/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" "https://127.0.0.1:$API_PORT/readyz"

kubeconfig() { # file user cert key
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kube-cp
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority-data: $(base64 -w0 < "$PKI/ca.crt")}
users:
- name: $2
  user: {client-certificate-data: $(base64 -w0 < "$3"), client-key-data: $(base64 -w0 < "$4")}
contexts:
- name: kube-cp
  context: {cluster: kube-cp, user: $2}
current-context: kube-cp
EOF
  chmod 600 "$1"
}
kubeconfig "$D/kubeconfig" kube-admin "$PKI/admin.crt" "$PKI/admin.key"

if [ "${KUBE_CP_KCM:-1}" = 1 ]; then
  kubeconfig "$RUN/kcm.kubeconfig" system:kube-controller-manager "$PKI/kcm.crt" "$PKI/kcm.key"
  nohup "$BIN/kube-controller-manager" --kubeconfig="$RUN/kcm.kubeconfig" --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port=0 --port=0 \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --use-service-account-credentials=true \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --controllers='*' --v=1 > "$LOG/kube-controller-manager.log" 2>&1 < /dev/null &
  echo $! > "$RUN/kube-controller-manager.pid"
  wait_for "the default ServiceAccount" 60 curl -fsS --cacert "$PKI/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
    "https://127.0.0.1:$API_PORT/api/v1/namespaces/default/serviceaccounts/default"
fi

cat > "$RUN/env" <<EOF
export KUBECONFIG=$D/kubeconfig
export KUBE_CP_SERVER=https://127.0.0.1:$API_PORT
export KUBE_CP_CA=$PKI/ca.crt
export KUBE_CP_CA_KEY=$PKI/ca.key
export KUBE_CP_ADMIN_TOKEN=$ADMIN_TOKEN
EOF
cat "$RUN/env"
