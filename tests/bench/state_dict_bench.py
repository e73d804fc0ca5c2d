#!/usr/bin/python3
"""A state dict in and out (docs/weight_sync.md): a
torch.nn.Transformer(d_model=512, 4+4 layers) state dict (124 tensors,
112 MiB) through tessera.torch against 4 daemons on this host, next to
torch.save / torch.load through the page cache, in one run (JSON lines):

- publish_state_dict, first (one CreateTensors for every tensor, begin,
  writes, publish; against torch.save's first save of a state dict just
  built, torch_save_first_s), the next two (each version still gets new memory:
  the tensors keep 2 published versions, and a third is open), and later
  calls (list, begin, writes, publish; a version reuses the memory of
  one retired);
- put_state_dict (one create and one write per tensor, unversioned);
- a read plan of the whole state dict: build, then run;
- get_state_dict (one read plan of the whole state dict, made and run);
- the logged operations a publish is made of, each timed on its own
  (create, begin, publish, delete of the 124 tensors, and of one).

Medians of --reps; the last line holds the goals (docs/weight_sync.md).

    python3 tests/bench/state_dict_bench.py --build BUILD_DIR [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def control_ops(c, layout, sd, reps: int) -> dict:
    """The logged operations a publish is made of, each on its own: create,
    begin, publish and delete of the state dict's tensors (fresh names each
    round, no data written), and of its first tensor alone; medians in ms
    (ops_<op>_ms for all of them, ops_<op>_one_ms for one)."""
    out = {}
    for suffix, items in (("", list(sd.items())),
                          ("_one", list(sd.items())[:1])):
        times = {"create": [], "begin": [], "publish": [], "delete": []}
        for r in range(max(reps, 5)):
            names = ["ops%s.%d.%s" % (suffix, r, k) for k, _ in items]
            batch = [{"name": n, "shape": tuple(v.shape),
                      "spec": layout(k, v), "dtype": v.numpy().dtype.name,
                      "versions": 2} for n, (k, v) in zip(names, items)]
            times["create"].append(timed(lambda: c.create_many(batch)))
            group = []
            times["begin"].append(timed(lambda: group.append(
                c.begin(names, empty=True, skip_zeroing=True))))
            times["publish"].append(timed(group[0].publish))
            times["delete"].append(timed(lambda: c.delete_many(names)))
        for op, values in times.items():
            out["ops_%s%s_ms" % (op, suffix)] = 1e3 * statistics.median(values)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(build, "python"))
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    os.environ.setdefault("TESSERA_SERVER_PATH",
                          os.path.join(build, "bin", "tessera-server"))
    import torch
    import conftest  # the Python tests' real daemons
    import tessera
    import tessera.torch as tt

    torch.manual_seed(0)
    model = torch.nn.Transformer(d_model=512, num_encoder_layers=4,
                                 num_decoder_layers=4)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    like = {k: torch.empty_like(v) for k, v in sd.items()}
    daemons = conftest.Daemons()
    try:
        c = tessera.connect(daemons.addresses[0], timeout=60)
        first = timed(lambda: tt.publish_state_dict(c, "sd.", sd))
        # Versions 2 and 3 take new memory too; from the fourth on a
        # version reuses a retired one's (version_set.h, "Reuse").
        new_memory = [timed(lambda: tt.publish_state_dict(c, "sd.", sd))
                      for _ in range(2)]
        later = [timed(lambda: tt.publish_state_dict(c, "sd.", sd))
                 for _ in range(args.reps)]
        puts = [timed(lambda: tt.put_state_dict(c, "put.", sd))
                for _ in range(args.reps)]
        plan_box = []
        build_s = timed(lambda: plan_box.append(
            tt.plan_state_dict(c, "sd.", like)))
        plan = plan_box[0]
        runs = [timed(plan.run) for _ in range(args.reps)]
        assert all(torch.equal(like[k], sd[k]) for k in sd)
        gets = [timed(lambda: tt.get_state_dict(c, "sd.", like))
                for _ in range(args.reps)]
        ops = control_ops(c, tt.default_layout(c), sd, args.reps)
    finally:
        daemons.stop()
    # The first publish wrote a state dict just built, whose pages the
    # kernel had never read; the repeated saves below write one it read
    # before. The first save of another such copy is the like of the first
    # publish.
    fresh = {k: v.clone() for k, v in sd.items()}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "sd.pt")
        save_first = timed(lambda: torch.save(fresh, path))
        saves = [timed(lambda: torch.save(sd, path))
                 for _ in range(args.reps)]
        loads = [timed(lambda: torch.load(path)) for _ in range(args.reps)]
    line = {
        "bench": "state_dict", "tensors": len(sd), "bytes": nbytes,
        "publish_first_s": first,
        "publish_new_memory_s": new_memory,
        "publish_s": statistics.median(later),
        "put_state_dict_s": statistics.median(puts),
        "plan_build_s": build_s, "plan_run_s": statistics.median(runs),
        "plan_pieces": plan.pieces,
        "get_state_dict_s": statistics.median(gets),
        "torch_save_first_s": save_first,
        "torch_save_s": statistics.median(saves),
        "torch_load_s": statistics.median(loads),
        **ops,
        "goal_in_s": 0.15, "goal_out_s": 0.1,
        "transport": "local path / data plane (one host)"}
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
