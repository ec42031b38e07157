"""Job plans on fake topologies: placement, CPU slices, env blocks, seeds, argv, every error."""

import pytest
from support.fake_sysfs import two_nodes


# --------------------------------------------------------------------------- through the CLI

def _cli_plan(tmp_path, sysfs, config_text, *overrides):
    import os
    import subprocess
    import sys
    from pathlib import Path
    cfg = tmp_path / "job.yaml"
    cfg.write_text(config_text)
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "FASTSAC_SYSFS_ROOT": str(sysfs), "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, "-m", "fastsac.launcher", str(cfg), f"run_dir={tmp_path}/run", *overrides,
                           "--plan"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.process
def test_cli_default_plan_is_byte_identical_to_binding_off_and_two_collectors_bind(tmp_path):
    from pathlib import Path
    quick = (Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml").read_text()
    sysfs = two_nodes(tmp_path / "sys", gpu_node=None)   # a GPU would need a torch that can drive it
    default = _cli_plan(tmp_path, sysfs, quick)
    assert quick.count("\ntrainer:\n") == 1
    off = _cli_plan(tmp_path, sysfs, quick.replace("\ntrainer:\n", "\ntrainer:\n  async_options:\n    numa_binding: off\n"))
    assert "NUMA binding off" in default and default == off
    two = _cli_plan(tmp_path, sysfs, quick, "trainer.async_options.num_collectors=2")
    assert "job plan: 1 learner + 2 collector(s); NUMA binding numactl (requested auto), placement spread" in two \
        or "NUMA binding inprocess (requested auto)" in two
    assert "--membind=1" in two or "--bind-node 1" in two


@pytest.mark.process
def test_cli_plan_on_a_two_node_two_gpu_machine_with_a_cpu_torch_exits_2(tmp_path):
    """`auto` on a machine with visible GPUs is the GPU: a torch that cannot drive it is exit 2
    naming torch's build, the driver and the install command, never a silent CPU plan."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    from support.fake_sysfs import two_gpus
    pytest.importorskip("torch").cuda.is_available() and pytest.skip("this torch can use a GPU")
    sysfs = two_gpus(tmp_path / "sys")
    (sysfs / "module" / "nvidia").mkdir(parents=True)
    (sysfs / "module" / "nvidia" / "version").write_text("570.86.15\n")
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "FASTSAC_SYSFS_ROOT": str(sysfs), "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, "-m", "fastsac.launcher", str(repo / "configs" / "quickstart.yaml"),
                           f"run_dir={tmp_path}/run", "trainer.async_options.num_collectors=2", "--plan"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "device: 'auto' → cuda:0 (2 NVIDIA GPUs visible, driver 570.86.15) but torch " in proc.stderr
    assert "(a CPU-only build) in this venv cannot use it; install a torch that can: .venv/bin/pip install " \
           "--force-reinstall torch --index-url https://download.pytorch.org/whl/cu128; or set device: cpu" in proc.stderr
    assert not (tmp_path / "run").exists()
