"""The scale benchmark's pure parts: the generated rows (deterministic, a smaller set a prefix of a larger one,
~650-byte SFT rows), the process roles, anonymous RSS apart from mapped files, SFT's first step from its progress line, and its tables from a result
built by hand (the run itself is minutes to hours: `python -m benchmarks run scale`)."""

import json
import subprocess
import sys

import psutil
import pytest

from benchmarks import scale
from benchmarks.__main__ import rows_list


def test_rows_are_drawn_from_the_seed_and_a_smaller_set_is_a_prefix():
    small = list(scale.rows("sft", 7, 1500))
    assert small == list(scale.rows("sft", 7, 1500))
    assert list(scale.rows("sft", 7, 2300))[:1500] == small  # across the 1000-row chunks too
    assert list(scale.rows("sft", 8, 1500)) != small
    assert len(small) == 1500 and set(small[0]) == {"prompt", "response"}
    mean = sum(len(json.dumps(r)) + 1 for r in small) / len(small)
    assert 550 < mean < 750  # ~650-byte lines
    pref, prompts = next(scale.rows("preference", 7, 1)), next(scale.rows("prompts", 7, 1))
    assert set(pref) == {"prompt", "chosen", "rejected"} and pref["chosen"] != pref["rejected"]
    assert set(prompts) == {"prompt", "label"} and prompts["label"].isdigit()
    assert pref["prompt"] != small[0]["prompt"]  # each kind has its own stream


def test_dataset_files_are_written_once_and_reused(tmp_path):
    files = scale.dataset_files(tmp_path, 3, 20)
    assert [json.loads(line) for line in files["sft"].read_text().splitlines()] == list(scale.rows("sft", 3, 20))
    stamp = files["sft"].stat().st_mtime_ns
    assert scale.dataset_files(tmp_path, 3, 20) == files and files["sft"].stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [f"data-v{scale.VERSION}-seed3"]  # no temporary folder left


def test_process_roles_from_command_lines():
    assert scale.role(["python", "-m", "flows.cli.main", "run"], True) == "driver"
    assert scale.role(["ray::StageWorker.run"], False) == "stage worker"
    assert scale.role(["ray::IDLE"], False) == "ray idle worker"
    assert scale.role(["/x/ray/core/src/ray/raylet/raylet", "--node_ip_address=1"], False) == "raylet"
    assert scale.role(["/x/gcs_server", "--port"], False) == "gcs_server"
    assert scale.role(["python", "-m", "uvicorn", "prefect.server.api.server:create_app"], False) == "prefect server"
    assert scale.role(["python", "/x/ray/_private/workers/default_worker.py", "--raylet-name=/tmp/r"], False) == "ray idle worker"
    # the raylet's arguments name the worker script
    assert scale.role(["/x/raylet/raylet", "--python_worker_command=python default_worker.py"], False) == "raylet"
    # data prep's pool, forked from the stage worker with its title, and their children
    assert scale.role(["ray::StageWorker.run"], False, parent="stage worker") == "stage worker's child"
    assert scale.role(["python", "-c", "x"], False, parent="stage worker's child") == "stage worker's child"
    assert scale.role(["ray::StageWorker.run"], False, parent="raylet") == "stage worker"
    assert scale.role(["sleep", "1"], False) == "other"


def test_first_step_from_the_progress_line():
    lines = [(100.0, "(StageWorker pid=1) [data_prep] rows: 10"),
             (130.0, "(StageWorker pid=1) [sft] step 2/2 (100%) loss=10.46 lr=2.5e-06 | 0.25 it/s, eta 0s")]
    found = scale.first_step(lines, compute_start=110.0)
    # step 2 ended 20 s after the start; a step is 1 / 0.25 = 4 s, known to within 1/0.245 - 1/0.255
    assert found.pop("first_step_error_s") == pytest.approx((1 / 0.245 - 1 / 0.255) / 2)
    assert found == {"first_step_s": 16.0, "to_step_s": 20.0, "step": 2, "rate": 0.25}
    assert scale.first_step(lines[:1], 110.0) == {}
    one = scale.first_step([(125.5, "[sft] step 1/1 (100%) loss=1 | 0.00 it/s, eta 0s")], 110.0)
    assert one == {"first_step_s": 15.5, "first_step_error_s": 0.0, "to_step_s": 15.5, "step": 1, "rate": 0.0}
    slow = scale.first_step([(190.0, "[sft] step 2/2 (100%) loss=1 | 0.00 it/s, eta 0s")], 110.0)
    assert slow["first_step_s"] is None and scale.first_step_cell(slow) == "< 80.0"
    assert scale.first_step_cell({"to_step_s": 20.0, **found, "first_step_error_s": 0.08}) == "16.0 ± 0.1"


def test_rows_option():
    assert rows_list("20000,200_000") == [20000, 200000]
    with pytest.raises(Exception, match="row counts"):
        rows_list("20k")


def stage(name, wall, compute, store, downloads, worker, tree, **extra):
    return {"stage": name, "wall_s": wall, "compute_s": compute, "store_bytes": store, "download_bytes": downloads,
            "tree_mib": tree, "roles": {"stage worker": {"process_mib": worker, "process_anon_mib": worker / 2,
                                                         "sum_mib": worker}}, **extra}


def size(rows, stages, wall, tree, mlartifacts):
    return {"rows": rows, "stages": stages, "wall_s": wall,
            "peaks": {"tree_mib": tree, "roles": {"driver": {"process_mib": 300.0, "sum_mib": 300.0},
                                                  "stage worker": {"process_mib": tree - 500, "sum_mib": tree - 400}}},
            "state_before": {}, "state_after": {"mlartifacts": mlartifacts, "downloads": 5e6},
            "reference": {"num_proc": 2, "sft": {"load_s": 1.0, "map_s": 4.0}, "prompts": {"load_s": 0.5, "map_s": 1.5},
                          "cache_bytes": 3e6, "peaks": {"tree_mib": 900.0, "roles": {"driver": {
                              "process_mib": 600.0, "process_anon_mib": 450.0, "sum_mib": 600.0}}}}}


def test_tables_from_a_result_built_by_hand():
    data = {"model": {"name": "50m", "params": 60_000_000, "bytes": 240e6},
            "sizes": [size(20_000, [stage("data_prep", 20.0, 15.0, 4e6, 0, 800.0, 2000.0),
                                    stage("sft", 30.0, 25.0, 240e6, 5e6, 2000.0, 3000.0, first_step_s=10.0,
                                          first_step_error_s=0.0, to_step_s=10.0)], 60.0, 3100.0, 244e6),
                      size(1_000_000, [stage("data_prep", 200.0, 190.0, 200e6, 0, 1800.0, 3000.0),
                                       stage("sft", 80.0, 70.0, 240e6, 200e6, 2250.0, 3500.0, first_step_s=55.0,
                                             first_step_error_s=0.3, to_step_s=60.0)],
                           290.0, 3600.0, 440e6)],
            "pin": [{"run": "rerun", "wall_s": 12.0, "state_before": {}, "state_after": {}, "ran": []},
                    {"run": "pin-1", "wall_s": 15.5, "state_before": {"mlartifacts": 10}, "state_after": {"mlartifacts": 240e6 + 10},
                     "ran": ["data_prep"]}]}
    made = scale.reports(data)
    assert list(made) == ["scale", "scale-processes", "scale-pin"]
    main = made["scale"]
    assert main.columns == scale.COLUMNS
    assert main.rows[0] == ["20k", "data_prep", "20.0", "15.0", "5.0", "", "4", "0", "800", "400", "2,000"]
    assert main.rows[1] == ["20k", "sft", "30.0", "25.0", "5.0", "10.0", "240", "5", "2,000", "1,000", "3,000"]
    assert main.rows[2] == ["20k", "rlhf run (whole command)", "60.0", "", "", "", "244", "5", "", "", "3,100"]
    assert main.rows[3] == ["20k", "datasets.map (2 procs): load + map", "7.0", "5.5", "1.5", "", "", "3", "600", "450", "900"]
    assert main.rows[5][5] == "55.0 ± 0.3"
    assert main.rows[7][:2] == ["1M", "datasets.map (2 procs): load + map"]
    # growth, largest against smallest: times as ratios, bytes (MB) and memory (MiB) as differences
    assert main.rows[8] == ["20k → 1M", "data_prep growth", "×10.00", "×12.67", "×2.00", "", "+196", "+0", "+1,000", "+500",
                            "+1,000"]
    assert main.rows[9] == ["20k → 1M", "sft growth", "×2.67", "×2.80", "×2.00", "×5.50", "+0", "+195", "+250", "+125", "+500"]
    assert len(main.rows) == 10
    assert "60M-parameter Llama (50m, fp32 safetensors 240 MB) and 20k, 1M rows" in main.title
    assert "load average" not in main.title  # none recorded
    data["cpus"], data["sizes"][0]["load_avg"], data["sizes"][1]["reference"]["load_avg"] = 2, [1.5, 2.0], [0.9, 3.25]
    assert "the machine's 1-minute load average while they ran: 0.9 to 3.2 on 2 cores" in scale.reports(data)["scale"].title
    assert main.as_json()["sizes"][0]["rows"] == 20_000  # the measurements travel with the table
    procs = made["scale-processes"]
    assert procs.columns == ["process role", "20k: largest / all MiB", "1M: largest / all MiB"]
    assert procs.rows == [["driver", "300 / 300", "300 / 300"], ["stage worker", "2,600 / 2,700", "3,100 / 3,200"],
                          ["whole tree", "3,100", "3,600"]]
    pin = made["scale-pin"]
    assert pin.rows == [["rerun, nothing changed (all cached)", "12.0", "", "0", "0", "none"],
                        ["+ inputs.sft_model=<the folder>, first time", "15.5", "+3.5", "240", "0", "data_prep"]]
    assert "\n| 20k | sft | 30.0 |" in main.markdown()


def test_peaks_by_role_and_for_a_span():
    """A process's peak is the largest high-water mark of its samples (above the RSS seen at any sample); the
    role's sum and the tree add the RSS of one sample."""
    MiB = scale.MiB
    w = scale.Watched(1.0, 0.0, samples=[(1.0, 10, "driver", 100 * MiB, 90 * MiB, 100 * MiB),
                                         (1.0, 11, "stage worker", 200 * MiB, 150 * MiB, 260 * MiB),
                                         (1.0, 12, "stage worker", 50 * MiB, 40 * MiB, 50 * MiB),
                                         (2.0, 10, "driver", 120 * MiB, 80 * MiB, 120 * MiB),
                                         (2.0, 11, "stage worker", 300 * MiB, 100 * MiB, 310 * MiB)])
    assert w.peaks() == {"tree_mib": 420.0, "roles": {
        "driver": {"process_mib": 120.0, "process_anon_mib": 90.0, "sum_mib": 120.0},
        "stage worker": {"process_mib": 310.0, "process_anon_mib": 150.0, "sum_mib": 300.0}}}  # each peak on its own
    assert w.peaks((0.5, 1.5))["roles"]["stage worker"] == {"process_mib": 260.0, "process_anon_mib": 150.0, "sum_mib": 250.0}
    assert [(p["pid"], p["roles"], p["peak_mib"], p["peak_anon_mib"]) for p in w.processes()] == [
        (11, ["stage worker"], 310.0, 150.0), (10, ["driver"], 120.0, 90.0), (12, ["stage worker"], 50.0, 40.0)]


def test_a_peak_between_two_samples_is_seen_once():
    """A process that holds 256 MiB for a moment and frees it before the first look: the first look reports a
    peak above 256 MiB though its RSS is back down; the second, after the reset, only what it holds then."""
    code = ("import sys\n"
            "b = bytearray(b'y' * (256 << 20)); del b\n"
            "print('ready', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        rss, _, first = scale.resident(psutil.Process(proc.pid))
        assert rss < 128 * scale.MiB and first > 256 * scale.MiB, (rss, first)
        rss, _, second = scale.resident(psutil.Process(proc.pid))
        assert second < 128 * scale.MiB, (rss, second)
    finally:
        proc.communicate("", timeout=30)


def test_anonymous_rss_is_what_a_process_allocated_not_the_file_it_maps(tmp_path):
    """A process that maps a 64 MiB file and reads it through gains its pages in RSS, not in RssAnon; one that
    fills 64 MiB of its own memory gains them in both."""
    (tmp_path / "f").write_bytes(b"x" * (64 * scale.MiB))
    code = ("import mmap, os, sys, time\n"
            "f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
            "total = sum(m[i] for i in range(0, len(m), 4096))\n"
            "b = bytearray(b'y' * (64 << 20)) if sys.argv[2] == 'own' else None\n"
            "print('ready', flush=True); sys.stdin.read()")
    for kind, rss_grows, anon_grows in (("mapped", True, False), ("own", True, True)):
        proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "f"), kind], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            rss, anon, _ = scale.resident(psutil.Process(proc.pid))
            assert (rss > 64 * scale.MiB, anon > 64 * scale.MiB) == (rss_grows, anon_grows), (kind, rss, anon)
        finally:
            proc.communicate("", timeout=30)


def test_stage_measures_read_a_state_folder(tmp_path, empty_store):
    """Per stage from a state folder's MLflow store: its run's span, its compute span, its artifacts' bytes, the
    copies of its inputs in the download cache, its memory while it ran, and SFT's first step from the metric."""
    import shutil

    from mlflow import MlflowClient

    state = tmp_path / "state"
    state.mkdir()
    shutil.copyfile(empty_store, state / "mlflow.db")
    client = MlflowClient(f"sqlite:///{state / 'mlflow.db'}")
    exp = client.create_experiment("rlhf-pipeline", artifact_location=(state / "mlartifacts").as_uri())
    ids = {}
    for stage, start, inputs in (("data_prep", 1000, {}), ("sft", 2000, {"rlhf.input.sft_data": "runs:/{data_prep}/sft_data"})):
        run = client.create_run(exp, start_time=start * 1000, tags={k: v.format(**ids) for k, v in inputs.items()})
        ids[stage] = run_id = run.info.run_id
        client.set_tag(run_id, "rlhf.compute_span", f"{start + 2} {start + 8}")
        (state / "mlartifacts" / run_id / "artifacts" / "out").mkdir(parents=True)
        (state / "mlartifacts" / run_id / "artifacts" / "out" / "w").write_bytes(b"x" * (100 if stage == "sft" else 10))
        if stage == "sft":
            client.log_metric(run_id, "time/first_step_s", 4.5)
        client.set_terminated(run_id, end_time=(start + 10) * 1000)
    (state / "downloads" / ids["data_prep"] / "sft_data").mkdir(parents=True)
    (state / "downloads" / ids["data_prep"] / "sft_data" / "rows").write_bytes(b"y" * 7)
    parent = client.create_run(exp, tags={"rlhf.kind": "pipeline", "stage.data_prep": f"ran {ids['data_prep']}",
                                          "stage.sft": f"ran {ids['sft']}", "stage.rm": "not run"})
    client.set_terminated(parent.info.run_id)
    watched = scale.Watched(20.0, 990.0, lines=[(2009.0, "(StageWorker pid=3) [sft] step 2/2 (100%) loss=1 | 0.50 it/s, eta 0s")],
                            samples=[(1005.0, 3, "stage worker", 100 * scale.MiB, 60 * scale.MiB, 100 * scale.MiB),
                                     (2005.0, 3, "stage worker", 300 * scale.MiB, 250 * scale.MiB, 300 * scale.MiB)])
    prep, sft = scale.stage_measures(state, watched)
    assert (prep["stage"], prep["wall_s"], prep["compute_s"], prep["store_bytes"], prep["download_bytes"]) == ("data_prep", 10, 6, 10, 0)
    assert (sft["stage"], sft["store_bytes"], sft["download_bytes"], sft["tree_mib"]) == ("sft", 100, 7, 300.0)
    assert prep["roles"]["stage worker"]["process_mib"] == 100.0
    # the metric, not the progress line's 2002 + 7 - 1 / 0.5 = 5 s
    assert (sft["first_step_s"], sft["first_step_error_s"], sft["first_step_from"], sft["to_step_s"]) == (4.5, 0.0, "metric", 7.0)
    assert sft["lines"] == [(9.0, "[sft] step 2/2 (100%) loss=1 | 0.50 it/s, eta 0s")]
