#!/usr/bin/env bash
# Brings up a one-node ferro cluster on this machine, inside the network namespace "ferro-lab"
# (nothing changes in the root network namespace; the system containerd is never used):
#   1. installs the Debian packages, builds ferro (cargo's dev profile; FERRO_PROFILE=release
#      for optimised binaries: scripts/lib.sh);
#   2. a local registry (Debian's docker-registry) on 127.0.0.1:5000 inside the namespace,
#      holding the test images built offline (busybox-static, ferro's static pause);
#   3. a private containerd inside the namespace (own config, root, state, socket; its CRI
#      plugin pulls from the registry over plain http and calls ferro-cni);
#   4. ferro-control-plane on 127.0.0.1:6443 inside the namespace;
#   5. one node: ferro-dns (cluster DNS on $LAB_DNS_IP, the pods' nameserver), then ferro-agent
#      in containerd's network and mount namespaces;
#   6. ferro-proxy (iptables mode) in the namespace, the node's kube-proxy;
#   7. ferro-csi (loop.csi.ferro.dev) next to the agent, the default StorageClass "loop" and
#      the default VolumeSnapshotClass "loop";
#   8. waits for the node to be Ready, deploys a demo (2 busybox httpd pods behind a ClusterIP
#      Service, and a pod keeping a log of its starts on a persistent volume) and prints the
#      kubectl commands to look at them.
# Running it again is fine: what runs is left alone. Pids are in /run/ferro/lab/*.pid.
# Stop everything with scripts/down.sh. Layout: docs/design/lab.md ("The quick start").
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
ferro_require_root
ferro_install_deps

BIN=$(ferro_bin_dir)
CP_DATA=$LAB_DATA/control-plane
CTRD_DATA=$LAB_DATA/containerd
CTRD_RUN=$LAB_STATE/containerd
CNI=$LAB_DATA/cni
NODE_DIR=$LAB_DATA/node
AGENT_ROOT=$LAB_DATA/agent
PAUSE_IMAGE=$LAB_REGISTRY/ferro/pause:1
BUSYBOX_IMAGE=$LAB_REGISTRY/ferro/busybox:1
DEMO_TIMEOUT=${FERRO_DEMO_TIMEOUT:-180}
KUBECTL=(ip netns exec "$LAB_NS" kubectl --kubeconfig "$CP_DATA/admin.kubeconfig")

step() { printf '\n==> %s\n' "$*"; }

# running NAME PATTERN: the pid in $LAB_STATE/NAME.pid is alive and its command line has PATTERN.
running() {
  local f=$LAB_STATE/$1.pid pid cmd
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
  [[ $cmd == *"$2"* ]]
}

# wait_for WHAT SECONDS LOG COMMAND...: polls COMMAND every 0.2 s; on timeout, fails with LOG.
wait_for() {
  local what=$1 secs=$2 log=$3 i
  shift 3
  for ((i = 0; i < secs * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "error: $what did not happen within ${secs}s; last lines of $log:" >&2
  tail -n 30 "$log" >&2 || true
  exit 1
}

step "building ferro (profile $FERRO_PROFILE)"
ferro_build -p ferro-control-plane -p ferro-agent -p ferro-cni -p ferro-proxy -p ferro-csi -p ferro-dns -p ferro-lab
install -d -m 0755 "$LAB_STATE" "$LAB_DATA" "$CP_DATA" "$CTRD_DATA" "$CTRD_RUN" \
  "$CNI/bin" "$CNI/conf" "$CNI/ipam" "$NODE_DIR" "$AGENT_ROOT" "$LAB_DATA/registry/data" \
  "$LAB_DATA/images" "$LAB_LOGS/pods" "$LAB_DATA/csi" "$LAB_STATE/csi"

step "network namespace $LAB_NS"
if ! ip netns list | grep -qw "$LAB_NS"; then
  ip netns add "$LAB_NS"
fi
ip -n "$LAB_NS" link set lo up

step "registry on $LAB_REGISTRY (inside $LAB_NS)"
cat >"$LAB_DATA/registry/config.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $LAB_DATA/registry/data
  delete:
    enabled: true
http:
  addr: $LAB_REGISTRY
YAML
if running registry docker-registry; then
  echo "docker-registry already running (pid $(cat "$LAB_STATE/registry.pid"))"
else
  ip netns exec "$LAB_NS" docker-registry serve "$LAB_DATA/registry/config.yml" \
    >"$LAB_STATE/registry.log" 2>&1 &
  echo $! >"$LAB_STATE/registry.pid"
fi
wait_for "the registry answering" 30 "$LAB_STATE/registry.log" \
  ip netns exec "$LAB_NS" curl -fsS "http://$LAB_REGISTRY/v2/"

step "test images (built offline) -> $LAB_REGISTRY/ferro/{pause,busybox}:1"
if [ ! -f "$LAB_DATA/images/pause.tar" ] || [ ! -f "$LAB_DATA/images/busybox.tar" ]; then
  "$BIN/ferro-lab" images --out "$LAB_DATA/images"
fi
for img in pause busybox; do
  ip netns exec "$LAB_NS" skopeo copy --quiet --dest-tls-verify=false \
    "docker-archive:$LAB_DATA/images/$img.tar" "docker://$LAB_REGISTRY/ferro/$img:1"
done

step "containerd (inside $LAB_NS, socket $LAB_CTRD_SOCK)"
install -m 0755 "$BIN/ferro-cni" "$CNI/bin/ferro"
install -m 0755 /usr/lib/cni/loopback "$CNI/bin/loopback"
cat >"$CNI/conf/10-ferro.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "ferro-lab",
  "plugins": [
    {
      "type": "ferro",
      "bridge": "ferro0",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {"ranges": [[{"subnet": "$LAB_POD_CIDR"}]], "dataDir": "$CNI/ipam"}
    }
  ]
}
JSON
"$BIN/ferro-lab" containerd-config --dir "$CTRD_DATA" --run-dir "$CTRD_RUN" \
  --sandbox-image "$PAUSE_IMAGE" --registry "$LAB_REGISTRY" \
  --cni-bin "$CNI/bin" --cni-conf "$CNI/conf" >"$CTRD_DATA/config.toml"
"$BIN/ferro-lab" containerd-start-script --config "$CTRD_DATA/config.toml" \
  --shim-dir "$CTRD_RUN/shims" >"$CTRD_RUN/start.sh"
if running containerd "containerd --config $CTRD_DATA/config.toml"; then
  echo "containerd already running (pid $(cat "$LAB_STATE/containerd.pid"))"
else
  if [ ! -d /run/containerd ]; then
    # containerd 1.6 needs /run/containerd as the mount point of its shim socket dir; the
    # empty directory is removed again by down.sh.
    touch "$LAB_STATE/created-run-containerd"
  fi
  ip netns exec "$LAB_NS" sh "$CTRD_RUN/start.sh" >"$LAB_STATE/containerd.log" 2>&1 &
  echo $! >"$LAB_STATE/containerd.pid"
fi
wait_for "containerd answering" 30 "$LAB_STATE/containerd.log" \
  ctr --address "$LAB_CTRD_SOCK" version
CTRD_PID=$(cat "$LAB_STATE/containerd.pid")
echo "pulling through CRI (registry config: $CTRD_DATA/certs.d/$LAB_REGISTRY/hosts.toml):"
"$BIN/ferro-lab" cri-pull --socket "$LAB_CTRD_SOCK" "$PAUSE_IMAGE" "$BUSYBOX_IMAGE"

step "ferro-control-plane (https://127.0.0.1:6443 inside $LAB_NS)"
if running control-plane ferro-control-plane; then
  echo "ferro-control-plane already running (pid $(cat "$LAB_STATE/control-plane.pid"))"
else
  ip netns exec "$LAB_NS" "$BIN/ferro-control-plane" \
    --data-dir "$CP_DATA" --bind-address 127.0.0.1 --secure-port 6443 \
    --allocate-node-cidrs --cluster-cidr 10.244.0.0/16 \
    >"$LAB_STATE/control-plane.log" 2>&1 &
  echo $! >"$LAB_STATE/control-plane.pid"
fi
wait_for "the API server answering /readyz" 30 "$LAB_STATE/control-plane.log" \
  "${KUBECTL[@]}" get --raw /readyz

step "ferro-dns (cluster DNS) on $LAB_DNS_IP:53 in $LAB_NS, the pods' nameserver"
if [ ! -s "$NODE_DIR/dns.kubeconfig" ]; then
  # its own identity: the system:ferro-dns ClusterRole (list/watch Services, EndpointSlices)
  "$BIN/ferro-control-plane" kubeconfig --data-dir "$CP_DATA" \
    --user system:ferro-dns \
    --server https://127.0.0.1:6443 >"$NODE_DIR/dns.kubeconfig.tmp"
  mv "$NODE_DIR/dns.kubeconfig.tmp" "$NODE_DIR/dns.kubeconfig"
fi
if running dns ferro-dns; then
  echo "ferro-dns already running (pid $(cat "$LAB_STATE/dns.pid"))"
else
  # Names outside cluster.local go to the resolvers of this machine's /etc/resolv.conf; the
  # namespace has no route out, so in the lab they fail (SERVFAIL) unless FERRO_DNS_UPSTREAM
  # names a resolver reachable from it (ip[:port]).
  upstream=()
  if [ -n "${FERRO_DNS_UPSTREAM:-}" ]; then upstream=(--upstream "$FERRO_DNS_UPSTREAM"); fi
  NO_COLOR=1 RUST_LOG=${RUST_LOG:-info} ip netns exec "$LAB_NS" "$BIN/ferro-dns" \
    --kubeconfig "$NODE_DIR/dns.kubeconfig" \
    --listen-address "$LAB_DNS_IP" --setup-interface ferro-dns0 "${upstream[@]}" \
    >"$LAB_STATE/dns.log" 2>&1 &
  echo $! >"$LAB_STATE/dns.pid"
fi
wait_for "ferro-dns answering" 30 "$LAB_STATE/dns.log" \
  grep -q "informers synced; answering" "$LAB_STATE/dns.log"

step "node $LAB_NODE: ferro-agent in containerd's network and mount namespaces"
if [ ! -s "$NODE_DIR/kubeconfig" ]; then
  "$BIN/ferro-control-plane" kubeconfig --data-dir "$CP_DATA" \
    --user "system:node:$LAB_NODE" --group system:nodes \
    --server https://127.0.0.1:6443 >"$NODE_DIR/kubeconfig.tmp"
  mv "$NODE_DIR/kubeconfig.tmp" "$NODE_DIR/kubeconfig"
fi
cat >"$NODE_DIR/kubelet-config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
podCIDR: $LAB_POD_CIDR
podLogsDir: $LAB_LOGS/pods
clusterDomain: cluster.local
clusterDNS: [$LAB_DNS_IP]
# A lab on a developer's machine: only a nearly full disk counts as disk pressure (upstream's
# default, nodefs.available<10%, would keep the demo from scheduling on a well-used disk).
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
YAML
if running agent ferro-agent &&
  [ "$(readlink "/proc/$(cat "$LAB_STATE/agent.pid")/ns/mnt")" != "$(readlink "/proc/$CTRD_PID/ns/mnt")" ]; then
  # The agent lives in containerd's mount namespace: a new containerd needs a new agent.
  echo "restarting ferro-agent (it is not in this containerd's mount namespace)"
  kill "$(cat "$LAB_STATE/agent.pid")"
  for _ in $(seq 1 50); do running agent ferro-agent || break; sleep 0.1; done
fi
AGENT_SINCE="" # when the agent was started by this run: Ready must be newer than that
if running agent ferro-agent; then
  echo "ferro-agent already running (pid $(cat "$LAB_STATE/agent.pid"))"
else
  AGENT_SINCE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  NO_COLOR=1 RUST_LOG=${RUST_LOG:-info} nsenter --target "$CTRD_PID" --net --mount -- \
    "$BIN/ferro-agent" \
    --kubeconfig "$NODE_DIR/kubeconfig" \
    --config "$NODE_DIR/kubelet-config.yaml" \
    --hostname-override "$LAB_NODE" --node-ip 127.0.0.1 \
    --root-dir "$AGENT_ROOT" \
    --container-runtime-endpoint "unix://$LAB_CTRD_SOCK" \
    --cgroup-root "$LAB_CGROUP_ROOT" \
    >"$LAB_STATE/agent.log" 2>&1 &
  echo $! >"$LAB_STATE/agent.pid"
fi
node_ready() {
  local ready
  ready=$("${KUBECTL[@]}" get node "$LAB_NODE" \
    -o 'jsonpath={range .status.conditions[?(@.type=="Ready")]}{.status} {.lastHeartbeatTime}{end}') || return 1
  # "True <heartbeat>", the heartbeat not older than this run's agent (not a stale status).
  [[ $ready == "True "* ]] && [[ ! ${ready#True } < $AGENT_SINCE ]]
}
wait_for "node $LAB_NODE becoming Ready" 90 "$LAB_STATE/agent.log" node_ready
"${KUBECTL[@]}" get nodes -o wide

step "ferro-csi (loop.csi.ferro.dev) in containerd's network and mount namespaces, StorageClass and VolumeSnapshotClass loop (default)"
if [ ! -s "$NODE_DIR/csi.kubeconfig" ]; then
  # its own identity, as install.sh gives it (ClusterRole system:ferro-csi)
  "$BIN/ferro-control-plane" kubeconfig --data-dir "$CP_DATA" \
    --user system:ferro-csi \
    --server https://127.0.0.1:6443 >"$NODE_DIR/csi.kubeconfig.tmp"
  mv "$NODE_DIR/csi.kubeconfig.tmp" "$NODE_DIR/csi.kubeconfig"
fi
if running csi ferro-csi &&
  [ "$(readlink "/proc/$(cat "$LAB_STATE/csi.pid")/ns/mnt")" != "$(readlink "/proc/$CTRD_PID/ns/mnt")" ]; then
  # Its mounts must be the ones runc sees: a new containerd needs a new ferro-csi.
  echo "restarting ferro-csi (it is not in this containerd's mount namespace)"
  kill "$(cat "$LAB_STATE/csi.pid")"
  for _ in $(seq 1 50); do running csi ferro-csi || break; sleep 0.1; done
fi
if running csi ferro-csi; then
  echo "ferro-csi already running (pid $(cat "$LAB_STATE/csi.pid"))"
else
  NO_COLOR=1 RUST_LOG=${RUST_LOG:-info} nsenter --target "$CTRD_PID" --net --mount -- \
    "$BIN/ferro-csi" --node-id "$LAB_NODE" --pool-size 4Gi \
    --data-dir "$LAB_DATA/csi" --endpoint "unix://$LAB_STATE/csi/csi.sock" \
    --registration-dir "$AGENT_ROOT/plugins_registry" --allowed-path "$AGENT_ROOT" \
    --kubeconfig "$NODE_DIR/csi.kubeconfig" \
    >"$LAB_STATE/csi.log" 2>&1 &
  echo $! >"$LAB_STATE/csi.pid"
fi
"${KUBECTL[@]}" apply -f - <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: loop
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: loop.csi.ferro.dev
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
allowVolumeExpansion: true
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata:
  name: loop
  annotations: {snapshot.storage.kubernetes.io/is-default-class: "true"}
driver: loop.csi.ferro.dev
deletionPolicy: Delete
YAML
csi_registered() {
  [ "$("${KUBECTL[@]}" get csinode "$LAB_NODE" -o 'jsonpath={.spec.drivers[*].name}' 2>/dev/null)" = loop.csi.ferro.dev ]
}
wait_for "ferro-csi registered with the agent (CSINode $LAB_NODE)" 60 "$LAB_STATE/csi.log" csi_registered

step "ferro-proxy (iptables mode) in $LAB_NS for node $LAB_NODE"
# Pods reach a ClusterIP through the bridge: the node (this namespace) must forward, and
# bridged replies must pass iptables so their DNAT is undone (both sysctls are per namespace:
# nothing changes in the root namespace).
ip netns exec "$LAB_NS" sysctl -qw net.ipv4.ip_forward=1
ip netns exec "$LAB_NS" sysctl -qw net.bridge.bridge-nf-call-iptables=1
if [ ! -s "$NODE_DIR/proxy.kubeconfig" ]; then
  # upstream's kube-proxy identity: system:kube-proxy, bound to system:node-proxier
  "$BIN/ferro-control-plane" kubeconfig --data-dir "$CP_DATA" \
    --user system:kube-proxy \
    --server https://127.0.0.1:6443 >"$NODE_DIR/proxy.kubeconfig.tmp"
  mv "$NODE_DIR/proxy.kubeconfig.tmp" "$NODE_DIR/proxy.kubeconfig"
fi
if running proxy ferro-proxy; then
  echo "ferro-proxy already running (pid $(cat "$LAB_STATE/proxy.pid"))"
else
  NO_COLOR=1 RUST_LOG=${RUST_LOG:-info} ip netns exec "$LAB_NS" "$BIN/ferro-proxy" \
    --kubeconfig "$NODE_DIR/proxy.kubeconfig" \
    --hostname-override "$LAB_NODE" --cluster-cidr 10.244.0.0/16 \
    --healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 \
    >"$LAB_STATE/proxy.log" 2>&1 &
  echo $! >"$LAB_STATE/proxy.pid"
fi
wait_for "ferro-proxy's first sync (/healthz 200)" 60 "$LAB_STATE/proxy.log" \
  ip netns exec "$LAB_NS" curl -fsS http://127.0.0.1:10256/healthz

step "demo Deployment: 2 x busybox httpd on port 8080 (its page in a tmpfs emptyDir), Service demo on port 80"
"${KUBECTL[@]}" apply -f - <<YAML
apiVersion: apps/v1
kind: Deployment
metadata:
  name: demo
  namespace: default
spec:
  replicas: 2
  selector:
    matchLabels: {app: demo}
  template:
    metadata:
      labels: {app: demo}
    spec:
      containers:
      - name: httpd
        image: $BUSYBOX_IMAGE
        command:
        - sh
        - -c
        - |
          echo "hello from \$(hostname)" >/www/index.html
          echo "serving /www on port 8080"
          exec httpd -f -v -p 8080 -h /www
        ports:
        - containerPort: 8080
        volumeMounts:
        - {name: www, mountPath: /www}
      volumes:
      - name: www
        emptyDir: {medium: Memory}
---
apiVersion: v1
kind: Service
metadata:
  name: demo
  namespace: default
spec:
  selector: {app: demo}
  ports:
  - {name: http, port: 80, targetPort: 8080}
YAML
demo_available() {
  # As `kubectl rollout status`: the spec observed, 2 updated and available, no old pods left.
  local st
  st=$("${KUBECTL[@]}" get deployment demo -o 'jsonpath={.metadata.generation} {.status.observedGeneration} {.status.updatedReplicas} {.status.availableReplicas} {.status.replicas}' 2>/dev/null) || return 1
  read -r gen observed updated available total <<<"$st"
  [ "$gen" = "$observed" ] && [ "$updated" = 2 ] && [ "$available" = 2 ] && [ "$total" = 2 ]
}
demo_ok=true
for ((i = 0; i < DEMO_TIMEOUT; i++)); do
  demo_available && break
  sleep 1
done
if ! demo_available; then
  demo_ok=false
  cat >&2 <<TXT

warning: the demo Deployment is not available after ${DEMO_TIMEOUT}s (FERRO_DEMO_TIMEOUT).
Everything else is up; look at the pods, their events and the agent's log
($LAB_STATE/agent.log):
TXT
  "${KUBECTL[@]}" get deployment,pods -o wide >&2 || true
  tail -n 20 "$LAB_STATE/agent.log" >&2 || true
fi
"${KUBECTL[@]}" get pods -o wide
DEMO_IP=$("${KUBECTL[@]}" get service demo -o 'jsonpath={.spec.clusterIP}' 2>/dev/null || true)
demo_service() { ip netns exec "$LAB_NS" curl -fsS --max-time 2 "http://$DEMO_IP/"; }
if $demo_ok && [ -n "$DEMO_IP" ]; then
  # A node sends to a ClusterIP through its default route (the route lookup happens before
  # the proxy's DNAT); the lab's namespace has none, so the Service range gets a route on the
  # pods' bridge (ferro-cni made it with the first pod). Inside the lab namespace only.
  ip -n "$LAB_NS" route replace 10.96.0.0/12 dev ferro0
  # The Service's rules follow its EndpointSlice: wait until ferro-proxy has written them.
  for ((i = 0; i < 60; i++)); do
    demo_service >/dev/null 2>&1 && break
    sleep 0.5
  done
  if ! demo_service; then
    demo_ok=false
    echo "warning: Service demo ($DEMO_IP:80) does not answer; see $LAB_STATE/proxy.log" >&2
  fi
fi
step "demo pod with a persistent volume: it appends its start time to /data/starts"
"${KUBECTL[@]}" apply -f - <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: demo-data
  namespace: default
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests: {storage: 64Mi}
---
apiVersion: v1
kind: Pod
metadata:
  name: demo-db
  namespace: default
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: db
    image: $BUSYBOX_IMAGE
    command: [sh, -c, 'date >>/data/starts; echo "started \$(wc -l </data/starts) time(s)"; exec sleep 2147483647']
    volumeMounts:
    - {name: data, mountPath: /data}
  volumes:
  - name: data
    persistentVolumeClaim: {claimName: demo-data}
YAML
# Its container answering (after a down.sh/up.sh the pod object says Running before the agent
# has started its container again).
db_answers() { "${KUBECTL[@]}" exec demo-db -- cat /data/starts; }
for ((i = 0; i < DEMO_TIMEOUT; i++)); do
  db_answers >/dev/null 2>&1 && break
  sleep 1
done
if db_answers >/dev/null 2>&1; then
  "${KUBECTL[@]}" get pvc,pv
  echo "demo-db's starts, kept on its volume:"
  db_answers
else
  demo_ok=false
  echo "warning: pod demo-db is not Running after ${DEMO_TIMEOUT}s; see $LAB_STATE/csi.log and $LAB_STATE/agent.log" >&2
  "${KUBECTL[@]}" describe pod demo-db >&2 || true
fi

# One pod's name and the other's address, for the hints below.
read -r POD_A POD_B_IP <<<"$("${KUBECTL[@]}" get pods -l app=demo \
  -o 'jsonpath={.items[0].metadata.name} {.items[1].status.podIP}' 2>/dev/null || true)" || true

K="ip netns exec $LAB_NS kubectl --kubeconfig $CP_DATA/admin.kubeconfig"
cat <<TXT

ferro is up in the network namespace $LAB_NS: ferro-control-plane (https://127.0.0.1:6443),
containerd ($LAB_CTRD_SOCK), the registry ($LAB_REGISTRY) and node $LAB_NODE (ferro-agent,
ferro-proxy, ferro-csi, ferro-dns on $LAB_DNS_IP).
Logs and pids: $LAB_STATE/*.log, $LAB_STATE/*.pid. Look at the demo with:

  $K get pods -o wide
  $K logs deployment/demo
  $K exec ${POD_A:-<pod>} -- wget -qO- http://${POD_B_IP:-<other pod IP>}:8080/
  ip netns exec $LAB_NS curl -s http://${POD_B_IP:-<pod IP>}:8080/
  $K exec ${POD_A:-<pod>} -- wget -qO- http://${DEMO_IP:-<cluster IP>}/      # a pod to the Service
  ip netns exec $LAB_NS curl -s http://${DEMO_IP:-<cluster IP>}/          # the Service, through ferro-proxy
  ip netns exec $LAB_NS iptables -t nat -S KUBE-SERVICES                     # its rules
  $K exec ${POD_A:-<pod>} -- nslookup demo                                  # cluster DNS (ferro-dns)
  $K get pvc,pv; $K exec demo-db -- cat /data/starts                        # the persistent volume
  $K delete pod demo-db && scripts/up.sh                                      # a new pod, the same data

Stop everything with: scripts/down.sh   (--purge also removes the data)
TXT
$demo_ok
