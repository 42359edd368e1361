"""The live view of `hacrl-fed simulate`: one line per agent from its worker's status, and the disk estimate."""

from __future__ import annotations

import io

from rich.console import Console

from hacrl_fed.launch.simulate import default_config
from hacrl_fed.report.progress import SimulationView, agent_line, disk_line


def test_agent_lines_say_what_each_worker_does():
    t = 1000.0
    assert agent_line("gemma3", {"phase": "loading", "model": "gemma3-270m", "device": "cpu", "since": t - 95}, t) \
        == "gemma3: loading gemma3-270m on cpu · 95 s"
    assert agent_line("a", {"phase": "generating", "step": 2, "rollouts": 8, "tokens": 212, "tokens_per_s": 11.94,
                            "since": t - 18}, t) == "a: generating step 2 (8 rollouts) — 212 tokens, 11.9 tokens/s · 18 s"
    assert agent_line("a", {"phase": "training", "step": 2, "update": 1, "updates": 3, "since": t}, t) \
        == "a: training step 2 — mini-batch 1/3 · 0 s"
    assert agent_line("a", {"phase": "evaluating", "step": 3, "problems": 16, "since": t}, t).startswith(
        "a: evaluating the model of step 3 (16 problems)")
    assert agent_line("a", {"phase": "idle", "step": 1, "since": t - 4}, t) \
        == "a: waiting for the coordinator (last step trained: 1) · 4 s"


def test_disk_estimate_of_the_default_run():
    cfg = default_config()                                  # checkpoint_every = 0: the exports alone
    disk = {"smollm2": {"export": 538_000_000, "checkpoint": 1_614_000_000},
            "gemma3": {"export": 1_072_000_000, "checkpoint": 3_216_000_000}}
    line = disk_line(cfg, disk)
    assert line.startswith("disk: this run will write ≈ 1.5 GiB: exported models 1.5 GiB")
    assert "smollm2 513 MiB" in line and "no checkpoints (run.checkpoint_every = 0)" in line
    cfg.run.checkpoint_every = 2                            # 3 steps: checkpoints after step 2 and at the end
    assert "checkpoints 9.0 GiB (2 kept per agent, every 2 step(s))" in disk_line(cfg, disk)


def test_view_shows_status_lines_and_prints_the_disk_once_loaded(tmp_path):
    out = io.StringIO()
    cfg = default_config()
    with SimulationView(cfg, tmp_path, console=Console(file=out, width=200), enabled=False) as view:
        view.loading("smollm2", "cpu", "smollm2-135m-instruct")
        view.status("smollm2", {"phase": "generating", "step": 1, "rollouts": 8, "tokens": 40,
                                "tokens_per_s": 10.0, "since": 0, "disk": {"export": 1024, "checkpoint": 0}})
        task = view.progress.tasks[0]
        assert task.description.startswith("smollm2: generating step 1 (8 rollouts) — 40 tokens")
        view.disk()
    assert "disk: this run will write ≈ 1.0 KiB" in out.getvalue()


def test_an_exported_agent_line_is_done(tmp_path):
    view = SimulationView(default_config(), tmp_path, console=Console(file=io.StringIO()), enabled=False)
    view.loading("gemma3", "cpu", "gemma3-270m")
    view.exported("gemma3", str(tmp_path / "export"))
    (task,) = view.progress.tasks
    assert task.finished and task.description == "gemma3: done, model exported"


def test_the_evaluation_before_training_is_not_called_after_step_0(tmp_path):
    out = io.StringIO()
    cfg = default_config()
    with SimulationView(cfg, tmp_path, console=Console(file=out, width=200), enabled=False) as view:
        view.record({"event": "run_start", "step": 0})
        view.record({"event": "eval", "step": 0, "prompts": 16, "eval_s": 14.2,
                     "agents": {"gemma3": {"avg@1": 0.625}, "smollm2": {"avg@1": 0.375}}})
        view.record({"event": "eval", "step": cfg.run.steps, "prompts": 16, "eval_s": 14.0,
                     "agents": {"gemma3": {"avg@1": 0.8125}, "smollm2": {"avg@1": 0.875}}})
    text = out.getvalue()
    assert "held-out accuracy before training (16 problems, greedy, 14 s): gemma3 0.625 | smollm2 0.375" in text
    assert f"held-out accuracy after step {cfg.run.steps} (16 problems" in text and "after step 0" not in text


def test_the_header_of_an_episode_run_gives_its_token_budgets(tmp_path):
    from pathlib import Path

    from hacrl_fed.config import SimulateConfig, load_config

    root = Path(__file__).resolve().parents[2]
    for config, wanted, unwanted in (
            ("episodes.toml", ("max episode tokens", "max_new_tokens 16 per turn, at most 6 turns", "1024"),
             "max resp tokens"),
            ("default.toml", ("max resp tokens",), "per turn")):
        out = io.StringIO()
        with SimulationView(load_config(root / "examples" / config, SimulateConfig), tmp_path,
                            console=Console(file=out, width=250), enabled=False):
            pass
        text = out.getvalue()
        assert all(w in text for w in wanted) and unwanted not in text, text


def test_an_episode_runs_evaluation_counts_episodes_and_gives_success_and_mean_reward(tmp_path):
    from pathlib import Path

    from hacrl_fed.config import SimulateConfig, load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "episodes.toml", SimulateConfig)
    out = io.StringIO()
    with SimulationView(cfg, tmp_path, console=Console(file=out, width=250), enabled=False) as view:
        view.record({"event": "run_start", "step": 0})
        view.record({"event": "eval", "step": 0, "prompts": 32, "eval_s": 80.4,
                     "agents": {"gemma3": {"avg@1": 0.03125, "reward_mean": 0.74},
                                "smollm2": {"avg@1": 0.03125, "reward_mean": 0.74}}})
        view.status("gemma3", {"phase": "evaluating", "step": 0, "problems": 32, "since": 0.0})
    text = out.getvalue()
    assert ("held-out success before training (32 episodes, greedy, 80 s): gemma3 0.031 (mean reward 0.740) | "
            "smollm2 0.031 (mean reward 0.740)") in text, text
    line = view.progress.tasks[-1].description
    assert "(32 episodes)" in line and "problems" not in line
