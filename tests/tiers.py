"""The fast tier: the tests that run in the pytest process alone (`python -m pytest -m fast`, or
`bash scripts/test.sh --fast`): 517 tests in 33 s on 2 cores at load 2 (410 took 94 s at load 5,
156 s at load 10), against ~18 min for the whole suite (fresh clones, warm caches, 2026-11-29).

Why a list of modules and a guard, not a folder or a measured time:
- A folder (prime-rl's tests/unit) would move half of tests/core and split modules whose fast and
  slow tests share helpers; the tier is a mark instead, given by tests/conftest.py to the tests of
  the modules below, less the tests named under each (with why they are not fast).
- What makes a test slow here is not its code but what it starts: a worker, the command line (a
  new Python, ~1 s of imports before any work), a sandbox, Slurm, a server. So the rule is one a
  test cannot break quietly: a test of the tier runs in this process. While a fast test sets up
  and runs, `in_process_only` refuses to execute any program (subprocess, os.exec*, posix_spawn,
  multiprocessing's spawn), to listen on a socket (a server), to connect beyond loopback (the
  network) and to load the tiny model (torch, built on first use); fork alone is allowed (a
  forked child starts in microseconds: the lock tests contend with them). The guard is on in
  every run, CI's included, so a new test that starts a worker in a listed module fails there,
  naming the line to add below, instead of joining the tier and blowing its time.
- In-process tests that are merely slow are bounded too: each test of the tier times out after
  FAST_TIMEOUT_S (pytest-timeout), and every run's summary names those slower than
  SLOW_IN_PROCESS_S (a `-m fast` run adds the tier's count and wall time): name them "slow" below.
- Modules are opted in: a new module joins the tier when it is added here, so the tier never
  grows by accident; a new test of a listed module joins it unless it is named under its module.
  tests/core/test_tiers.py checks every name here, the tier's coverage and its rules, timing nothing.

Chosen by measuring (issue 38, item 5): each folder run with `-n 2 --durations=0` and a probe that
recorded what each test executed or listened on. Every in-process test was kept except the tiny
model's, one importing torch (16 s) and those over 10 s; and modules with only one or two
in-process tests among many that start processes were left out whole (not worth their list).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, NoReturn

import _posixsubprocess
import pytest

TIER_MARK = "fast"
BUDGET_S = 180.0          # the tier's wall time on 2 cores (scripts/test.sh --fast), collection included
SLOW_IN_PROCESS_S = 15.0  # a test of the tier slower than this is named in the run's summary
FAST_TIMEOUT_S = 60       # and one slower than this fails (pytest-timeout): it belongs in the full suite
# Marks and fixtures of the tests that need what the tier does without: never fast, whatever the list says.
HEAVY_MARKS = ("slurm", "bwrap", "llm", "vllm")
HEAVY_FIXTURES = ("slurm_cluster", "janitor", "vllm_python", "vllm_server", "restored_weights", "relay",
                  "task_image", "harness_image", "mini_swe_agent_venv")
# Folders no test of the tier comes from: each of their tests needs Slurm, vLLM, verl, FUSE mounts or workers.
HEAVY_FOLDERS = ("tests/slurm/", "tests/vllm/", "tests/verl/", "tests/fsrig/", "tests/faults/")

# Why a test of a listed module is not in the tier.
WHY = {
    "cli": "runs the hpc-rollout command line in a new Python",
    "worker": "starts worker processes",
    "python": "runs another Python (a script, an import check)",
    "sandbox": "starts a sandbox",
    "bwrap": "is marked needs_bwrap (skips without bubblewrap)",
    "program": "runs another program (git, cp, scontrol, a stub apptainer, verl-setup.sh)",
    "server": "listens on a socket (an LLM stand-in, a proxy)",
    "model": "loads the tiny model (torch; built on first use)",
    "slow": f"runs in this process but takes longer than {SLOW_IN_PROCESS_S:.0f} s",
}

# module -> {test function (all its parameters): why it is not in the tier}
FAST_MODULES: dict[str, dict[str, str]] = {
    "tests/agents/test_parsers.py": {},
    "tests/agents/test_reasoning_gym.py": {
        "test_end_to_end_rewards_as_reasoning_gym_scores_them": "cli",
        "test_rows_from_the_source_for_two_datasets": "cli",
        "test_scorers_that_may_run_the_answer_run_it_in_a_scorer_sandbox": "sandbox",
        "test_tasks_check_grades_each_row_s_expected_answer_1_and_no_answer_0": "cli",
        "test_the_tasks_commands_name_the_family": "cli",
        "test_unknown_datasets_and_bad_options_are_refused_with_the_dataset_s_own_words": "cli",
    },
    "tests/agents/test_rows_and_graders.py": {
        "test_code_runner_reports_each_failure_kind": "sandbox",
        "test_math_verify_equivalences_and_its_bound": "python",
    },
    "tests/agents/test_verl_reward_policy.py": {
        "test_the_operators_function_scores_with_the_rows_kwargs_in_its_sandbox": "sandbox",
    },
    "tests/agents/test_verl_scorer_sandbox.py": {
        "test_a_code_executing_scorer_is_refused_at_submit_when_the_run_has_no_sandbox": "cli",
        "test_reward_kwargs_that_clash_with_the_scorers_arguments_are_refused_at_submit": "cli",
        "test_the_operators_reward_function_runs_sandboxed_and_cannot_write_the_host": "sandbox",
        "test_verls_code_and_math_scorers_run_the_reply_in_a_sandbox_not_on_the_host": "program",
    },
    "tests/core/test_atomic_write.py": {},
    "tests/core/test_batches.py": {
        "test_a_clean_stop_mid_batch_gives_unstarted_jobs_back_unchanged": "worker",
        "test_a_corrupt_batch_is_quarantined_and_the_other_batches_run": "worker",
        "test_cancel_inside_a_queued_batch_and_inside_a_claimed_one": "worker",
        "test_sigkill_after_jobs_of_a_batch_were_handed_off_to_the_eval_queue": "worker",
        "test_sigkill_of_a_worker_holding_a_partly_committed_batch_ends_every_job_once": "worker",
        "test_submit_queues_batches_status_counts_jobs_and_inspect_finds_a_batched_job": "cli",
    },
    "tests/core/test_checked_settings.py": {},
    "tests/core/test_cli_help.py": {
        "test_bash_completion_completes_commands_and_options": "cli",
    },
    "tests/core/test_cluster_summary.py": {
        "test_cancel_stop_and_dead_workers_reach_a_large_run_through_the_summary": "worker",
    },
    "tests/core/test_code_shape.py": {},
    "tests/core/test_config.py": {},
    "tests/core/test_config_source.py": {
        "test_submit_and_a_worker_refuse_it_with_the_same_words": "worker",
    },
    "tests/core/test_console_text.py": {
        "test_a_failed_job_s_error_is_printed_whole_by_inspect_and_status": "cli",
        "test_a_rejected_row_names_its_file_and_every_bracketed_word": "cli",
        "test_a_run_directory_with_brackets_is_named_whole_by_every_command": "cli",
        "test_tasks_check_without_math_verify_names_the_extra_once": "python",
    },
    "tests/core/test_damaged_shards.py": {},
    "tests/core/test_dependencies.py": {
        "test_a_command_group_that_cannot_be_imported_is_not_hidden": "cli",
        "test_every_command_group_loads_without_the_optional_extras": "python",
    },
    "tests/core/test_dir_watch.py": {},
    "tests/core/test_docs.py": {},
    "tests/core/test_errors.py": {
        "test_every_public_exception_of_the_package_derives_from_the_one_base": "slow",
    },
    "tests/core/test_event_loop.py": {},
    "tests/core/test_events.py": {},
    "tests/core/test_fencing.py": {
        "test_a_worker_paused_past_its_lease_commits_nothing_and_rejoins": "worker",
        "test_an_attempt_lost_to_fencing_is_not_charged_to_the_job": "worker",
    },
    "tests/core/test_full_spool_budget.py": {},
    "tests/core/test_idle_exit.py": {
        "test_a_worker_leaves_once_idle_after_committing_its_buffered_rows": "worker",
        "test_the_idle_window_does_not_start_while_a_shard_is_being_written": "slow",
    },
    "tests/core/test_init_and_json.py": {
        "test_init_writes_a_commented_run_toml_and_an_example_that_runs": "cli",
        "test_launch_json_of_a_slurm_dry_run": "cli",
        "test_launch_wait_json_keeps_standard_output_json": "cli",
        "test_submit_json_reports_rejected_rows_with_their_lines": "cli",
    },
    "tests/core/test_instance_schema.py": {
        "test_good_rows_and_verl_rows_pass": "cli",
        "test_handlers_lists_every_handler_and_one_handler_s_fields": "cli",
        "test_submit_refuses_unknown_keys_with_the_key_meant": "cli",
        "test_the_bundled_task_sets_pass_their_schemas": "program",
    },
    "tests/core/test_journal.py": {
        "test_a_clean_stop_during_eval_returns_the_job_to_eval_with_its_run_output": "worker",
        "test_a_fenced_worker_with_an_open_journal_harms_nothing": "worker",
        "test_a_run_that_ends_while_eval_is_full_waits_here_for_a_slot_not_in_the_eval_queue": "worker",
        "test_a_stop_without_grace_gives_jobs_waiting_for_eval_back_to_eval_uncharged": "worker",
        "test_a_worker_killed_during_eval_resumes_at_eval_elsewhere_and_never_runs_again": "worker",
        "test_on_a_large_run_a_job_waiting_for_eval_starts_when_a_slot_frees": "worker",
    },
    "tests/core/test_layers.py": {},
    "tests/core/test_lease.py": {},
    "tests/core/test_long_horizon_settings.py": {
        "test_staleness_is_checked_in_run_toml_submit_and_the_cli": "cli",
    },
    "tests/core/test_node_local_lock.py": {},
    "tests/core/test_pipeline.py": {
        "test_a_corrupt_ticket_is_quarantined_and_the_rest_runs": "worker",
        "test_backpressure_stops_init_when_run_queue_is_full": "worker",
        "test_eval_only_workers_take_over_from_any_node": "worker",
        "test_failures_become_rows_with_reasons": "worker",
        "test_launch_wait_status_inspect_tail": "cli",
        "test_launch_without_wait_then_stop": "cli",
        "test_tail_follow_prints_rows_as_shards_land": "cli",
    },
    "tests/core/test_planted_files.py": {
        "test_a_planted_link_in_place_of_a_jobs_directory_is_moved_aside_not_followed": "worker",
        "test_a_planted_queue_entry_is_quarantined_unread_and_the_worker_stays_answerable": "worker",
        "test_a_sticky_queue_opened_to_trusted_users_is_left_open": "worker",
        "test_a_worker_started_by_hand_closes_them_too_with_an_event": "worker",
        "test_launch_closes_queue_directories_an_old_umask_left_open_and_says_so": "cli",
    },
    "tests/core/test_pools.py": {
        "test_init_refuses_pools_of_zero_and_warns_when_nothing_evaluates": "cli",
        "test_launch_refuses_pools_that_never_finish_a_job": "cli",
    },
    "tests/core/test_progress_totals.py": {},
    "tests/core/test_prompt_handoff.py": {},
    "tests/core/test_recovery.py": {},
    "tests/core/test_runtimes.py": {},
    "tests/core/test_scale_ops.py": {},
    "tests/core/test_scaling.py": {},
    "tests/core/test_settings_spec.py": {},
    "tests/core/test_shards_and_handlers.py": {},
    "tests/core/test_spool_reads.py": {},
    "tests/core/test_stuck_claims.py": {
        "test_a_directory_in_a_queue_is_quarantined_and_the_worker_goes_on": "worker",
        "test_a_ticket_whose_job_id_walks_out_of_the_spool_is_quarantined": "worker",
        "test_a_worker_stopped_now_returns_its_running_job_to_init_and_says_so": "worker",
        "test_claims_left_by_a_stopped_worker_are_returned": "worker",
    },
    "tests/core/test_submit.py": {
        "test_cli_exit_status_and_strict": "cli",
        "test_submit_needs_a_run_directory": "cli",
        "test_submit_points_to_launch_only_when_no_worker_is_running": "cli",
    },
    "tests/core/test_submitit_adapter.py": {},
    "tests/core/test_scheduling.py": {},
    "tests/core/test_tiers.py": {},
    "tests/core/test_timeout_cancel.py": {
        "test_a_job_cancelled_before_its_worker_starts_is_not_run": "worker",
        "test_budget_counts_stage_time_only": "worker",
        "test_cancel_cli_needs_a_target": "cli",
        "test_cancel_running_queued_group_and_all": "worker",
    },
    "tests/core/test_transitions.py": {},
    "tests/core/test_worker_memory.py": {},
    "tests/core/test_worker_settings.py": {},
    "tests/core/test_worker_stop.py": {},
    "tests/llm/test_registry.py": {
        "test_concurrent_writers_never_lose_an_entry": "python",
    },
    "tests/llm/test_router.py": {
        "test_a_backend_failing_its_health_check_gets_no_task": "server",
        "test_down_backend_is_probed_and_revived": "server",
        "test_health_checks_follow_run_toml": "server",
        "test_sessions_outside_a_worker_close_their_connections_when_the_last_ends_never_a_worker_s": "server",
        "test_tasks_picking_together_while_health_checks_run_spread_out": "server",
    },
    "tests/proxy/test_submit_harness.py": {},
    "tests/proxy/test_wire.py": {},
    "tests/report/test_figures.py": {},
    "tests/report/test_report_parts.py": {},
    "tests/sandbox/test_apptainer.py": {
        "test_env_file_keeps_commas_quotes_and_no_host_variables": "program",
        "test_image_build_sif_runs_apptainer_build_fakeroot": "program",
        "test_start_runs_the_exact_command_line_and_cleans_up": "sandbox",
    },
    "tests/sandbox/test_bwrap_argv.py": {},
    "tests/sandbox/test_images.py": {
        "test_dir_image_layer_runs_post_in_a_copy_of_the_base": "program",
        "test_dir_image_on_a_local_directory_image_runs_setup_on_the_host_then_post": "program",
        "test_two_processes_build_one_image_once": "python",
    },
    "tests/sandbox/test_loopback.py": {
        "test_concurrent_processes_get_unique_addresses": "python",
        "test_release_and_stale_reclaim": "program",
    },
    "tests/sandbox/test_policy.py": {
        "test_a_planted_ticket_asking_for_the_host_root_is_refused_when_a_worker_starts_it": "worker",
        "test_every_sandbox_a_handler_opens_goes_through_the_policy": "bwrap",
        "test_network_is_denied_unless_the_operator_allows_it": "server",
        "test_the_host_root_as_image_is_refused_at_submit_with_file_and_line": "cli",
    },
    "tests/test_benchmarks.py": {
        "test_benchmark_runs_quick_and_prints_its_json_line": "program",
    },
    "tests/test_slurm_probe.py": {
        "test_where_the_cluster_is_required_a_missing_one_fails": "python",
        "test_without_a_cluster_slurm_tests_skip_even_as_root": "python",
    },
    "tests/trainer/test_adaptive.py": {},
    "tests/trainer/test_batch.py": {
        "test_verl_key_names_and_torch_tensors": "slow",
    },
    "tests/trainer/test_dead_writers.py": {
        "test_recovery_closes_the_writer_of_a_sigkilled_worker": "worker",
    },
    "tests/trainer/test_tail.py": {
        "test_a_poll_costs_the_same_with_100_shards_per_writer_as_with_one": "slow",
        "test_eight_skewed_writers_and_a_reader_killed_at_random_deliver_every_row_once": "python",
    },
    "tests/trainer/test_time_limit_backends.py": {
        "test_busy_backends_asks_each_registered_backend_over_http": "server",
        "test_a_backend_that_dribbles_or_floods_its_metrics_page_is_not_waited_for": "server",
    },
    "tests/trainer/test_trl_parts.py": {},
    "tests/trainer/test_verl_outcomes.py": {},
    "tests/trainer/test_verl_parts.py": {
        "test_a_custom_reward_function_is_called_the_way_verl_calls_it": "sandbox",
        "test_importing_the_manager_package_and_the_handlers_does_not_import_verl": "python",
    },
    "tests/trainer/test_verl_routing.py": {},
    "tests/trainer/test_verl_settings_map.py": {},
    "tests/trainer/test_verl_submit.py": {
        "test_a_gsm8k_parquet_is_refused_with_the_fix_then_mapped_by_option_or_run_toml": "cli",
    },
}


def is_fast(module: str, function: str, fixtures: Iterable[str] = (), marks: Iterable[str] = ()) -> bool:
    """Whether the test `function` of `module` (a path from the repository root) is in the tier."""
    excluded = FAST_MODULES.get(module)
    if excluded is None or function in excluded or module.startswith(HEAVY_FOLDERS):
        return False
    return not (set(marks) & set(HEAVY_MARKS) or set(fixtures) & set(HEAVY_FIXTURES))


class NotInProcess(RuntimeError):
    """A test of the fast tier did what only the full suite may (a program, a server, the network, the model)."""


def _program(argv: Any) -> str:
    first = argv[0] if isinstance(argv, (list, tuple)) and argv else argv
    name = os.fsdecode(first) if isinstance(first, (bytes, str, os.PathLike)) else repr(first)
    return " ".join(os.path.basename(name).split()[:3])


def _is_loopback(host: Any) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextmanager
def in_process_only(test: str, module: str = "", function: str = "") -> Iterator[list[str]]:
    """Refuse, while inside, what a test of the tier must not do; yields what was refused (a test
    may catch the NotInProcess raised, so the caller checks this list too)."""
    refused: list[str] = []
    line = f"add \"{function}\": \"<{'|'.join(WHY)}>\" under \"{module}\" in tests/tiers.py FAST_MODULES" if module else ""

    def refuse(what: str) -> NoReturn:
        refused.append(what)
        raise NotInProcess(f"{test} is in the fast tier (tests/tiers.py: tests that run in the pytest process) "
                           f"but it {what}. If it must, {line or 'take it out of the tier'}.")

    def program(argv_at: int) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            refuse(f"runs a program ({_program(args[argv_at]) if len(args) > argv_at else '?'})")
        return guarded

    original_connect, original_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def listen(self: socket.socket, *args: Any) -> None:
        refuse("listens on a socket (a server)")

    def outside(self: socket.socket, address: Any) -> bool:
        return self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0])

    def connect(self: socket.socket, address: Any) -> None:
        if outside(self, address):
            refuse(f"connects to {address[0]} (the network)")
        original_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if outside(self, address):
            refuse(f"connects to {address[0]} (the network)")
        return original_connect_ex(self, address)

    from orchestrator.devserver import tiny_model   # light (filelock); its builders import torch when called
    original_cached = tiny_model.cached_model
    real_builders = (tiny_model.build, tiny_model.build_digits)

    def cached_model(recipe: str, builder: Callable[..., None]) -> Any:
        if builder in real_builders:
            refuse("loads the tiny model (torch; built on first use)")
        return original_cached(recipe, builder)

    with pytest.MonkeyPatch.context() as patch:
        # subprocess (asyncio's too) and multiprocessing's spawn and forkserver execute through fork_exec
        patch.setattr(_posixsubprocess, "fork_exec", program(0))
        if hasattr(subprocess, "_fork_exec"):   # Python 3.12+ binds it in subprocess
            patch.setattr(subprocess, "_fork_exec", program(0))
        for name, argv_at in (("posix_spawn", 1), ("posix_spawnp", 1), ("execv", 1), ("execve", 1), ("system", 0)):
            patch.setattr(os, name, program(argv_at))
        patch.setattr(socket.socket, "listen", listen)
        patch.setattr(socket.socket, "connect", connect)
        patch.setattr(socket.socket, "connect_ex", connect_ex)
        patch.setattr(tiny_model, "cached_model", cached_model)
        yield refused
