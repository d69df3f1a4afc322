"""What a newcomer met on the simulator (issue 34, item 8), run as they run it: ``sim init``'s
export line pasted into a shell, ``watch`` with no device-plugin flag, a vGPU removed by hand
(``sim remove``), and the A16 example on a simulated A16 board.

Expected values by hand: the seed's vGPU UUIDs are the README's (uuid5 of "<node>/<VF>"), an
A2's VF0 is function 4 (docs/domain.md §1; the harvester/pcidevices A2 capture), and where an
A16's VFs land is not established (the catalogue's ``vfOffset`` is null; the simulator puts
VF0 at function 4, as on the A2).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from reconciler.catalog import default_catalog
from tests.simnode import NODE, REPO, SEED, make_sim, run_vgpuctl

GPU = "0000:08:00.0"
U5 = "5ed3b3e8-ffe3-55db-be73-567bd703a205"  # the seed's vGPU on 0000:08:00.5 (README.md)
U6 = "ec1a8b91-526b-5a21-87ce-cae919e6adf0"  # … on 0000:08:00.6


def _shell(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in bash as a user's shell runs it, ``vgpuctl`` being this checkout's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    env.pop("NODE_NAME", None)
    vgpuctl = f"{shlex.quote(sys.executable)} -m reconciler"
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f'vgpuctl() {{ {vgpuctl} "$@"; }}\n{script}'],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
        check=False,
    )


# -- sim init's export line ----------------------------------------------------------------------


def test_sim_init_prints_an_export_line_the_next_commands_use(tmp_path: Path) -> None:
    host = tmp_path / "my host"  # a space: the line is quoted for the shell
    res = run_vgpuctl("sim", "init", host, "--gpu", f"A2@{GPU}", "--node", NODE)
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        f"export VGPUCTL_SYSFS_ROOT='{host}/sys' "
        f"VGPUCTL_SRIOV_MANAGE='{host}/bin/sriov-manage' "
        f"VGPUCTL_NVIDIA_SMI='{host}/bin/nvidia-smi' "
        f"VGPUCTL_NODE={NODE}\n"
    )
    assert "Paste the export line below" in res.stderr
    assert _env_of(res.stdout)["VGPUCTL_SYSFS_ROOT"] == f"{host}/sys"


def test_the_readme_demo_commands_paste_as_they_are(tmp_path: Path) -> None:
    """eval the export line, then the demo's commands with no flag: plan, apply, re-plan."""
    host = tmp_path / "demo"
    res = _shell(
        f'eval "$(vgpuctl sim init {shlex.quote(str(host))} --gpu A2@{GPU} --node {NODE})"\n'
        "vgpuctl apply desired-state/harvester-kgd9c.yaml --yes >/dev/null\n"
        "vgpuctl status\n"
        "vgpuctl plan desired-state/harvester-kgd9c.yaml --detailed-exitcode\n"
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"harvester-kgd9c-000008005   0000:08:00.5   harvester-kgd9c   true      {U5}" in (
        res.stdout
    )
    assert res.stdout.rstrip().endswith("No changes. The node matches the desired state.")
    assert (host / "state").is_dir()  # the simulated host's own state directory was used


def test_a_relative_directory_still_names_the_host_after_a_cd(tmp_path: Path) -> None:
    res = run_vgpuctl("sim", "init", "rel", "--gpu", f"A2@{GPU}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"export VGPUCTL_SYSFS_ROOT={tmp_path}/rel/sys ")
    assert "VGPUCTL_NODE" not in res.stdout  # no --node given: none is set


# -- watch on a simulated host -----------------------------------------------------------------


def _watch(env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    full.pop("NODE_NAME", None)
    full.update(env)
    return subprocess.Popen(
        [sys.executable, "-m", "reconciler", "watch", str(SEED), "--listen", "127.0.0.1:0",
         "--rescan-interval", "0.3", "--log-format", "json", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=full, cwd=REPO,
    )  # fmt: skip


def _env_of(export_line: str) -> dict[str, str]:
    words = shlex.split(export_line)
    assert words[0] == "export"
    return dict(w.split("=", 1) for w in words[1:])


def test_watch_on_a_simulated_host_needs_no_device_plugin_flag(tmp_path: Path) -> None:
    """No --no-device-plugin: a simulated host has no kubelet, so none are served, one line
    says so, and the node converges; SIGTERM ends it with 0."""
    node = make_sim(tmp_path / "host", [f"A2@{GPU}"])
    proc = _watch({"VGPUCTL_SYSFS_ROOT": str(node.dir / "sys"), "VGPUCTL_NODE": NODE})
    lines: list[dict[str, object]] = []
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    for raw in proc.stderr:
        try:
            lines.append(json.loads(raw))
        except ValueError:  # a line that is no log record: an error at start
            lines.append({"msg": raw})
        if "converged" in str(lines[-1].get("msg")) or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, (lines, rest)
    messages = [str(d.get("msg")) for d in lines]
    plugins = tmp_path / "host" / "kubelet" / "device-plugins"
    assert (
        f"device plugins: not served: this simulated host has no kubelet ({plugins} does not "
        "exist; create it, or pass --plugin-dir, to serve them)"
    ) in messages
    assert any(m.startswith("converged: the node matches the desired state") for m in messages)


def test_a_kubelet_dir_given_and_missing_is_still_an_error(tmp_path: Path) -> None:
    """Given on purpose (or on a real host, where the agent's mount may be wrong), a missing
    device-plugin directory stops the watch as before."""
    node = make_sim(tmp_path / "host", [f"A2@{GPU}"])
    env = {"VGPUCTL_SYSFS_ROOT": str(node.dir / "sys"), "VGPUCTL_NODE": NODE}
    proc = _watch(env, "--kubelet-dir", str(tmp_path / "nowhere"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert f"device-plugin directory {tmp_path / 'nowhere' / 'device-plugins'} does not " in err


# -- sim remove --------------------------------------------------------------------------------


def test_sim_remove_is_drift_the_next_plan_puts_back(tmp_path: Path) -> None:
    node = make_sim(tmp_path / "host", [f"A2@{GPU}"])
    node.ok("apply", SEED, "--yes")
    res = run_vgpuctl("sim", "remove", node.dir, "0000:08:00.5")
    assert (res.returncode, res.stderr) == (
        0, f"vGPU {U5} (NVIDIA A2-4Q) on VF 0000:08:00.5 removed by hand\n"
    )  # fmt: skip
    plan = node.run("plan", SEED, "--detailed-exitcode")
    assert plan.returncode == 2, plan.stdout + plan.stderr
    assert f"+ vgpu 0000:08:00.5  NVIDIA A2-4Q  (uuid {U5})" in plan.stdout
    assert "Plan: 1 to create, 0 to change, 0 to remove, 0 blocked." in plan.stdout
    # By UUID too.
    res = run_vgpuctl("sim", "remove", node.dir, U6)
    assert res.returncode == 0, res.stderr
    assert "Plan: 2 to create" in node.run("plan", SEED).stdout
    # Nothing there any more: said, not a traceback.
    res = run_vgpuctl("sim", "remove", node.dir, "0000:08:00.5")
    assert (res.returncode, res.stderr) == (1, "error: VF 0000:08:00.5 hosts no vGPU\n")


def test_sim_remove_refuses_a_held_vgpu(tmp_path: Path) -> None:
    node = make_sim(tmp_path / "host", [f"A2@{GPU}"])
    node.ok("apply", SEED, "--yes")
    assert run_vgpuctl("sim", "hold", node.dir, U5).returncode == 0
    res = run_vgpuctl("sim", "remove", node.dir, "0000:08:00.5")
    assert res.returncode == 1
    assert res.stderr == (
        f"error: vGPU {U5} on VF 0000:08:00.5 is held by simulated VM: the kernel would block "
        "this removal until it lets go ('vgpuctl sim release' first)\n"
    )
    assert "No changes." in node.ok("plan", SEED).stdout  # still there


def test_sim_remove_on_a_vfio_gpu(tmp_path: Path) -> None:
    """A vfio VF's vGPU is its current_vgpu_type: removed by hand, the VF shows none."""
    node = make_sim(tmp_path / "host", [f"A2@{GPU}:vfio"])
    node.ok("apply", SEED, "--yes")
    res = run_vgpuctl("sim", "remove", node.dir, "0000:08:00.6")
    assert (res.returncode, res.stderr) == (
        0, "vGPU (NVIDIA A2-4A) on VF 0000:08:00.6 removed by hand\n"
    )  # fmt: skip
    current = node.dir / "sys/bus/pci/devices/0000:08:00.6/nvidia/current_vgpu_type"
    assert current.read_text() == "0\n"


# -- the A16 example ---------------------------------------------------------------------------


def test_the_a16_example_and_the_simulator_agree(tmp_path: Path) -> None:
    """The example claims no VF function for the A16 (none is established: the catalogue's
    vfOffset is null); on the simulated board its index keys land from function 4 on."""
    example = REPO / "desired-state" / "examples" / "a16-board.yaml"
    text = example.read_text()
    a16 = default_catalog().model("A16")
    assert a16 is not None and a16.vf_offset is None
    assert not re.search(r"A16's first VF is function \.\d", text)
    assert "not established" in text
    node = make_sim(tmp_path / "host", ["A16@0000:89:00.0"], node="vdi-node-a")
    node.ok("apply", example, "--yes")
    status = node.ok("status", "-o", "json").stdout
    doc = json.loads(status)
    hosted = {
        vf["address"]: vf["vgpu"]["type"]
        for gpu in doc["gpus"]
        for vf in gpu.get("vfs", [])
        if vf.get("vgpu")
    }
    assert hosted == {
        **{f"0000:89:00.{f}": "NVIDIA A16-2B" for f in range(4, 8)},
        "0000:89:01.0": "NVIDIA A16-2B",
        "0000:89:01.1": "NVIDIA A16-2B",
        **{f"0000:8a:00.{f}": "NVIDIA A16-4Q" for f in range(4, 8)},
        "0000:8b:00.4": "NVIDIA A16-16Q",
    }
