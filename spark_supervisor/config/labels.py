"""The names the supervisor puts on what it runs, the environment it sets itself, and the config's size
limits: the vocabulary every other config module (and the rest of the daemon) shares."""

OWNER_LABEL = "spark-supervisor.owner"
HASH_LABEL = "spark-supervisor.spec-hash"
NODE_LABEL = "spark-supervisor.node"
ROLE_LABEL = "spark-supervisor.role"
RAY_STATE_LABEL = "spark-supervisor.ray-state"  # on a Ray head: "dashboard" (REST) or "gcs" (no dashboard)
# On every short-lived container the daemon creates (value: its role), so that no daemon, nor a concurrent
# `check --preflight`, takes another's for stale.
HELPER_LABEL = "spark-supervisor.helper"
LABEL_PREFIX = "spark-supervisor."

# Set per node from nodes[].fabric_ip / fabric_interface (commands.node_env); never shared between nodes.
FABRIC_ENV = ("VLLM_HOST_IP", "RAY_NODE_IP_ADDRESS", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
              "TP_SOCKET_IFNAME", "UCX_NET_DEVICES", "OMPI_MCA_btl_tcp_if_include")
API_KEY_ENV = "VLLM_API_KEY"  # how the serve receives the key (never on its command line)
MAX_CONFIG_BYTES = 1 << 20
MAX_KEY_BYTES = 4096
