
import json, sys
from ray._raylet import GcsClient
from ray.core.generated.gcs_pb2 import GcsNodeInfo
nodes = GcsClient(address=sys.argv[1]).get_all_node_info(timeout=float(sys.argv[2]))
print(json.dumps({"data": {"result": {"result": [
    {"node_id": n.node_id.hex(), "node_ip": n.node_manager_address, "state": GcsNodeInfo.GcsNodeState.Name(n.state),
     "is_head_node": n.is_head_node, "resources_total": dict(n.resources_total)} for n in nodes.values()]}}}))
