"""Capacity rules against node lists (as the dashboard reports them)."""
from raytrain.capacity import Node, capacity_problem, tensor_group_problem


def nodes(*gpus, cpus=16):
    return [Node(f"n{i}", f"10.0.0.{i}", {"CPU": cpus, "GPU": g}) for i, g in enumerate(gpus)]


def test_workers_fit_node_by_node():
    assert capacity_problem(8, {"CPU": 1, "GPU": 1}, nodes(4, 4)) is None
    msg = capacity_problem(9, {"CPU": 1, "GPU": 1}, nodes(4, 4))
    assert "needs 9 CPU, 9 GPU; the cluster has 32 CPU and 8 GPU on 2 node(s), room for 8" in msg
    assert "use --workers 8 or fewer" in msg


def test_half_a_gpu_per_node_does_not_add_up_across_nodes():
    # 2 workers of 1 GPU do not fit on two nodes with 0.5 GPU free each
    assert capacity_problem(2, {"CPU": 1, "GPU": 1}, nodes(0.5, 0.5)) is not None


def test_dead_nodes_do_not_count():
    ns = nodes(4, 4)
    ns[1].alive = False
    assert "room for 4" in capacity_problem(8, {"CPU": 1, "GPU": 1}, ns)


def test_tensor_group_must_fit_in_one_node():
    assert tensor_group_problem(4, {"CPU": 1, "GPU": 1}, nodes(4, 4)) is None
    msg = tensor_group_problem(8, {"CPU": 1, "GPU": 1}, nodes(4, 4))
    assert "--tp 8 x --gpus-per-worker 1 needs 8 GPUs in one node" in msg and "use --tp 4 or less" in msg
    assert tensor_group_problem(8, {"CPU": 1}, nodes(0, 0)) is None  # CPU workers: no GPU grouping
