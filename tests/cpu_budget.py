"""The suite's CPU budget, by area (CONTRIBUTING.md, "The CI budget").

CI's wall time on the 2-core box varies 1.3-1.6x from day to day; the CPU seconds a test consumes vary much
less. So the budget is in CPU seconds, measured per test with `scripts/test_cpu.py` (every process a test
starts counted): 1,500 s for the whole suite keeps a fresh clone's `.ci/run` within 20 minutes on a day 1.6x
slower than the fastest seen. Every test file belongs to exactly one area (tests/test_suite_schedule.py checks
it); a new test is paid for inside its area, or the contributor notes say where its cost was found. The
split was set again from run 72's figures (2026-11-29: 1,306 CPU-s in all), each area ~10 % above its own,
hosts then given 10 more (run 75, on a slower hour, read 170) from pipelines end to end.

    PYTHONPATH=scripts python -m pytest -p test_cpu -n 2 --dist loadfile --no-loadscope-reorder
    python scripts/test_cpu.py --areas          # each area's CPU against its budget
"""

from __future__ import annotations

TOTAL_BUDGET_S = 1500

# area -> (its budget in CPU seconds, what it holds, its test files)
AREAS: dict[str, tuple[int, str, tuple[str, ...]]] = {
    "exactness": (
        265,
        "the float64 matrix, the losses, the strategy, packing and log-probs, reproducibility",
        (
            "test_agg_loss.py",
            "test_algorithms.py",
            "test_checkpoint_strategy.py",
            "test_compile_layers.py",
            "test_cuda_check_smoke.py",
            "test_exactness.py",
            "test_exactness_ep.py",
            "test_exactness_moe.py",
            "test_exactness_sp.py",
            "test_exactness_vision.py",
            "test_exactness_vision_supervised.py",
            "test_invariance.py",
            "test_logprobs.py",
            "test_lora.py",
            "test_model.py",
            "test_non_finite.py",
            "test_packing.py",
            "test_pipeline_advantages.py",
            "test_preference_losses.py",
            "test_qwen3_vl.py",
            "test_reproducibility.py",
            "test_reproducibility_unpinned.py",
            "test_rollout_correction.py",
            "test_strategy.py",
            "test_strategy_optimizer_reset.py",
            "test_vision.py",
            "test_weights.py",
        ),
    ),
    "pipelines end to end": (
        495,
        "roll-train runs of every pipeline: resume, failures, LoRA, SFT, preferences, distillation",
        (
            "test_byo_pipeline.py",
            "test_count_shapes.py",
            "test_critic.py",
            "test_dapo.py",
            "test_distill.py",
            "test_eval.py",
            "test_expert_parallel_run.py",
            "test_failures.py",
            "test_local_backend.py",
            "test_lora_moe.py",
            "test_lora_run.py",
            "test_lora_vision.py",
            "test_moe_multi_turn.py",
            "test_moe_partial_rollouts.py",
            "test_moe_run.py",
            "test_policy_losses.py",
            "test_preference_pipelines.py",
            "test_progress.py",
            "test_resume.py",
            "test_roll_view.py",
            "test_rollout_in_actor.py",
            "test_run_dir.py",
            "test_sequence_parallel_run.py",
            "test_run_log.py",
            "test_sft_pipeline.py",
            "test_sft_resume.py",
            "test_tracking.py",
            "test_traces.py",
            "test_user_imports.py",
            "test_distill_vision.py",
            "test_vision_folder.py",
            "test_vision_run.py",
            "test_vision_critic.py",
            "test_vision_supervised.py",
            "test_warm_driver.py",
            "test_warm_workers.py",
            "test_worker_errors.py",
        ),
    ),
    "engines": (
        135,
        "the hf and vLLM engines, weight sync, vLLM runs and judges",
        (
            "test_exact_rollout.py",
            "test_exact_vision.py",
            "test_hf_engine.py",
            "test_mismatch.py",
            "test_router_replay.py",
            "test_sampler.py",
            "test_vllm_cpu.py",
            "test_vllm_engine.py",
            "test_vllm_judge.py",
            "test_vllm_lora.py",
        ),
    ),
    "rewards and sandbox": (
        105,
        "reward functions, models, judges, routing, domains, the code sandbox",
        (
            "test_code_task.py",
            "test_domain_sampler.py",
            "test_judge.py",
            "test_mixed_domains.py",
            "test_resume_rewards.py",
            "test_reward_config.py",
            "test_reward_model.py",
            "test_reward_ray.py",
            "test_reward_routing.py",
            "test_rewards.py",
            "test_rewards_and_task.py",
            "test_sandbox.py",
            "test_sandbox_hostile.py",
        ),
    ),
    "multi-turn and environments": (
        120,
        "environments, tools, episodes, multi-turn pipelines and runs",
        (
            "test_async_episodes_images.py",
            "test_environments.py",
            "test_environments_runner.py",
            "test_episodes.py",
            "test_multi_turn_images.py",
            "test_multi_turn_pipeline.py",
            "test_multi_turn_run.py",
            "test_multiturn_masks.py",
            "test_openenv.py",
            "test_ors.py",
            "test_sources.py",
            "test_tool_calls.py",
            "test_tools.py",
            "test_turns.py",
        ),
    ),
    "async": (
        10,
        "one step ahead and fully async: schedules, partial rollouts, episode rounds",
        (
            "test_async_episodes.py",
            "test_async_rollout.py",
            "test_async_schedule.py",
            "test_episode_rounds.py",
            "test_partial_rollouts.py",
        ),
    ),
    "hosts": (
        180,
        "Ray clusters: placement, raylets, three namespace hosts, job submission",
        (
            "test_node_labels.py",
            "test_pipeline_ray.py",
            "test_placement.py",
            "test_raylets.py",
            "test_several_hosts.py",
        ),
    ),
    "docs and benchmarks": (
        110,
        "the docs' commands, every benchmark's smoke run, the examples",
        (
            "test_benchmark_scripts.py",
            "test_byo_example.py",
            "test_docs.py",
            "test_short_forms.py",
            "test_vs_trl_report.py",
        ),
    ),
    "config, data and tooling": (
        80,
        "config and data checks, preflight, the install, the house rules, the suite's own tools",
        (
            "test_cli_config.py",
            "test_backend_auto.py",
            "test_config_reference.py",
            "test_cpu_per_test.py",
            "test_data.py",
            "test_data_errors.py",
            "test_data_files.py",
            "test_docker_entrypoint.py",
            "test_gpu_session.py",
            "test_house.py",
            "test_imports.py",
            "test_install.py",
            "test_packaging.py",
            "test_pair_data.py",
            "test_preflight.py",
            "test_prompts.py",
            "test_sft_data.py",
            "test_shipped_runs.py",
            "test_suite_schedule.py",
        ),
    ),
}


def area_of(test_file: str) -> str:
    """The area of a test file (a name like test_resume.py, or a path ending in one)."""
    name = test_file.rsplit("/", 1)[-1]
    for area, (_, _, files) in AREAS.items():
        if name in files:
            return area
    raise KeyError(f"{name} is in no area of tests/cpu_budget.py: add it to the area whose budget pays for it")
