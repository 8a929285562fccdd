"""DRA classes' device counting (issue 40): what a `gpu_capacity` tick spends matching a DRA class's
selectors against every device ResourceSlices publish, side by side in one run:

1. `every device`: each device evaluated afresh (CEL per device, what a plain reading of the slices does);
2. `first tick`: gpufn's `matching_devices` with empty memos (one evaluation per distinct device content);
3. `one slice changed`: the next tick after one node's slice got a new resourceVersion;
4. `steady tick`: nothing changed since the last tick.

Nodes of 8 GPUs, half one product and half another, one DeviceClass selector and one class selector.
Wall and process CPU seconds; ratios are CPU ratios against `every device`.

    .venv/bin/python bench/dra_bench.py --nodes 1000

Writes bench/results/dra.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "devcluster"))

from gpufn_dagster import device_cel  # noqa: E402
from gpufn_devcluster.nodes import gpu_devices, resource_slice  # noqa: E402

DRIVER = "gpu.nvidia.com"
SELECTORS = [f'device.driver == "{DRIVER}"', f'device.attributes["{DRIVER}"].productName == "NVIDIA H100 80GB HBM3"']


def published(nodes: int, version: int = 1) -> list[dict]:
    out = []
    for i in range(nodes):
        item = resource_slice(f"n{i}", DRIVER, gpu_devices("NVIDIA H100 80GB HBM3" if i % 2 else "NVIDIA A100", "80Gi", 8))
        item["metadata"].update(uid=f"uid-{i}", resourceVersion=str(version))
        out.append(item)
    return out


def timed(fn) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()
    slices = published(args.nodes)

    def every_device() -> int:
        return sum(1 for _, driver, device in device_cel.slice_devices(slices)
                   if device_cel.matches(SELECTORS, device_cel.device_activation(driver, device)))

    rows = {}
    rows["every device"] = timed(every_device)
    device_cel._SLICE_COUNTS.clear()
    device_cel._VERDICTS.clear()
    rows["first tick"] = timed(lambda: device_cel.matching_devices(SELECTORS, slices).total())
    changed = [dict(s) for s in slices]
    changed[0] = {**changed[0], "metadata": {**changed[0]["metadata"], "resourceVersion": "2"}}
    rows["one slice changed"] = timed(lambda: device_cel.matching_devices(SELECTORS, changed).total())
    rows["steady tick"] = timed(lambda: device_cel.matching_devices(SELECTORS, changed).total())
    expected = rows["every device"][2]
    assert all(r[2] == expected for r in rows.values()), {k: r[2] for k, r in rows.items()}
    base_cpu = rows["every device"][1]
    print(f"{args.nodes} nodes x 8 devices ({args.nodes * 8}), {expected} matching\n")
    print("| reading | wall s | CPU s | CPU / every device |")
    print("|---|---:|---:|---:|")
    for name, (wall, cpu, _) in rows.items():
        print(f"| {name} | {wall:.4f} | {cpu:.4f} | {cpu / base_cpu:.4f} |")
    out = HERE / "results" / "dra.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"nodes": args.nodes, "devices": args.nodes * 8, "matching": expected,
                               "rows": {k: {"wall_s": w, "cpu_s": c} for k, (w, c, _) in rows.items()}}, indent=2))


if __name__ == "__main__":
    main()
