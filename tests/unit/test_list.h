/*
 * test_list.h: every unit test, one TEST(name) line each, in run order.
 *
 * No include guard: unit.h includes it to declare test_<name>, runner.c to
 * build the table. A test is written as TEST_IMPL(name) { ... } in
 * tests/unit/test_<area>.c; the Makefile links every tests/unit/test_*.c.
 */

/* runtime: test_runtime.c */
TEST(version_matches_header)
TEST(status_codes_are_stable)
TEST(status_str_names_each_code)
TEST(status_str_unknown_code)
TEST(alloc_default_roundtrip)
TEST(compile_api_source_to_plan)
TEST(compile_api_reports_diagnostics)

/* front end: test_lang.c */
TEST(arena_alloc_zeroed_and_aligned)
TEST(diag_caret_under_utf8_and_tabs)
TEST(diag_long_line_window)
TEST(diag_dedup_with_notes)
TEST(diag_stops_after_limit)
TEST(suggest_close_names_only)
TEST(frontend_checks_buffer)
TEST(frontend_set_is_checked)
TEST(frontend_reports_every_error)
TEST(frontend_refuses_huge_buffer)

/* compiler: placements and collectives, test_shard.c */
TEST(shard_megatron_tp_layer_counts)
TEST(shard_megatron_sequence_parallel_counts)
TEST(shard_zero_gradient_sync)
TEST(shard_moe_all_to_all)
TEST(shard_recompute_repeats_forward_collectives)

/* compiler: pipeline schedules and their timeline, test_sched.c */
TEST(sched_rejects_bad_parameters)
TEST(sched_bubble_anchors)
TEST(sched_bubble_gpipe_and_1f1b)
TEST(sched_bubble_interleaved)
TEST(sched_units_and_transfers)
TEST(sched_peak_inflight)
TEST(sched_1f1b_matches_fig4)
TEST(sched_interleaved_matches_fig4)
TEST(sched_dump_1f1b_pp4_m8)
TEST(sched_dump_interleaved_pp2_m4_v2)
TEST(sched_single_stage_interleaved)
TEST(sched_simulate_unit_times)
TEST(sched_simulate_detects_stuck_receive)
TEST(sched_kind_names)
TEST(timeline_svg_golden)
TEST(timeline_svg_interleaved)

/* compiler: static deadlock and consistency check, test_verify.c */
TEST(verify_passes_mixed_program)
TEST(verify_swapped_collectives_deadlock)
TEST(verify_swapped_collectives_mismatch)
TEST(verify_collective_type_mismatch)
TEST(verify_collective_size_mismatch)
TEST(verify_collective_not_member)
TEST(verify_missing_receive)
TEST(verify_receive_without_send)
TEST(verify_send_recv_size_mismatch)
TEST(verify_receive_matches_oldest_send_by_tag)
TEST(verify_deadlock_list_is_capped)
TEST(verify_deadlock_names_missing_members)
TEST(verify_rejects_malformed_input)
TEST(verify_message_is_cut_to_fit)
TEST(verify_large_mesh)
TEST(verify_sched_grid)
TEST(verify_sched_catches_reordered_receive)
TEST(verify_sched_catches_dropped_send)

/* compiler: every rank's program and the static check, test_ranks.c */
TEST(ranks_generated_programs_pass)
TEST(ranks_swapped_collectives_caught)
TEST(ranks_missing_receive_caught)
TEST(stats_zero_memory_matches_anchors)

/* compiler: the plan file, written and read with libyaml, test_plan.c */
TEST(plan_roundtrip_tp)
TEST(plan_roundtrip_pipeline)
TEST(plan_roundtrip_examples)
TEST(plan_from_compiled)
TEST(plan_read_refuses_bad_plans)
TEST(plan_read_checks_each_op)
TEST(plan_write_and_from_refuse)
TEST(plan_read_survives_mutations)

/* compiler: the memory plan, test_memplan.c */
TEST(memplan_saved_activations_by_hand)
TEST(memplan_recompute_keeps_layer_inputs)
TEST(memplan_slots_follow_the_schedule)
TEST(memplan_zero3_gathers_two_layers)
TEST(memplan_every_room_aligns_to_16_bytes)
TEST(memplan_moe_route_room_fits_every_device)

/* kernels/cpu: each area keeps its own list */
#include "test_list_kcpu_dense.h"
#include "test_list_kcpu_attention.h"

/* runtime: deterministic initialisation, test_init.c */
TEST(init_philox_known_answer)
TEST(init_slices_match_the_whole)
TEST(init_normal_moments)

/* runtime: token shards and streams, test_data.c */
TEST(data_shard_roundtrip)
TEST(data_shard_refusals)
TEST(data_stream_reads_shards_in_order)
TEST(data_stream_rank_slices_make_the_global_batch)
TEST(data_stream_refusals)
TEST(data_checkpoint_resume_same_losses)

/* runtime: GPT-2 BPE, test_bpe.c */
TEST(bpe_merges_by_rank)
TEST(bpe_round_trips_unicode)
TEST(bpe_refusals)

/* runtime: the one-rank plan interpreter, test_exec.c */
TEST(exec_gradient_matches_finite_differences)
TEST(exec_training_lowers_the_loss)
TEST(exec_step_is_adamw_of_the_clipped_gradient)
TEST(exec_memory_is_the_plan)
TEST(exec_guarded_arena_only_through_copies_and_kernels)
TEST(exec_fused_bias_gelu_same_bits)
TEST(exec_loss_read_once_a_step)
TEST(exec_cpu16_is_the_cpu_bf16_run)
TEST(parallel_dp_losses_equal_one_rank)
TEST(parallel_deterministic_dp_is_bit_identical)
TEST(parallel_tp_pp_losses_equal_one_rank)
TEST(parallel_ep_losses_equal_one_rank)
TEST(parallel_mixed_precision_follows_one_rank)
TEST(parallel_guarded_arenas_match)
TEST(parallel_overlap_is_bit_identical)
TEST(parallel_comm_timed_in_turn)
TEST(parallel_cuda_ranks_share_a_gpu)
TEST(parallel_cuda_ranks_over_nccl)
TEST(parallel_cuda_deterministic_dp_is_bit_identical)
TEST(parallel_cuda_overlap_timed_on_the_gpu)
TEST(parallel_cuda_turns_timed_on_the_gpu)
TEST(parallel_cuda_nccl_under_tsan)
TEST(exec_refuses_placements_meshc_did_not_write)
TEST(parallel_failing_rank_stops_the_job)
TEST(parallel_failed_step_is_the_last)

/* mixed precision on the CPU reference: test_precision.c */
TEST(kcpu_rounds_to_bf16_and_fp16)
TEST(precision_gradients_accumulate_in_fp32)
TEST(precision_sp_position_embedding_sums_in_fp32)
TEST(precision_bf16_fp16_train_as_fp32)
TEST(precision_fp16_loss_scale_skips_and_grows)
TEST(precision_checkpoint_resumes_to_the_bit)
TEST(exec_cuda_trains_as_the_cpu)

/* the op profile: test_profile.c */
TEST(exec_profile_splits_the_step)
TEST(exec_cuda_profile_on_the_gpu)
TEST(api_context_errors_are_clear)
TEST(api_context_uses_its_allocator)
TEST(api_info_steps_and_sampling)

/* runtime: the threads communicator, test_comm.c */
TEST(comm_threads_collectives_match_serial)
TEST(comm_threads_split_groups)
TEST(comm_threads_abort_stops_everyone)
TEST(comm_names_other_reads_the_backends_words)
TEST(comm_threads_timeout_names_the_wait)
TEST(comm_threads_hold_sees_the_abort)
TEST(comm_checked_refuses_host_buffers_and_moves_bf16)
TEST(comm_threads_async_queue)
TEST(comm_threads_async_hooks)

/* runtime: the TCP communicator and its rendezvous, test_comm_tcp.c */
TEST(comm_tcp_collectives_match_serial)
TEST(comm_tcp_split_groups)
TEST(comm_tcp_sums_equal_threads_bits)
TEST(comm_tcp_abort_stops_everyone)
TEST(comm_tcp_watch_sees_the_abort)
TEST(comm_tcp_timeout_names_the_wait)
TEST(comm_tcp_dead_process_is_named)
TEST(comm_tcp_finish_names_the_failed_rank)
TEST(comm_tcp_rendezvous)
TEST(comm_tcp_address_from_env)
TEST(comm_tcp_async_queue)

/* runtime: the NCCL communicator, test_comm_nccl.c (without a GPU: SKIP) */
TEST(comm_nccl_available_says_why)
TEST(comm_nccl_world_fails_cleanly_without_gpu)
TEST(comm_nccl_one_rank_calls)
TEST(comm_nccl_world_over_threads)
TEST(comm_nccl_failure_aborts_the_world)
TEST(comm_nccl_world_times_out_without_its_ranks)
TEST(comm_nccl_world_names_a_rank_without_its_gpu)
TEST(comm_nccl_queue_on_its_own_world)
TEST(comm_nccl_ranks_over_threads)
TEST(comm_nccl_failed_rank_stops_the_others)
TEST(comm_nccl_ordered_calls_follow_the_stream)
TEST(comm_nccl_queue_ordered_on_the_gpu)
TEST(comm_nccl_ring_channels)

/* runtime: devices and the choice of one, test_device.c */
TEST(device_cpu_round_trips)
TEST(device_guarded_memory_faults_outside_its_calls)
TEST(device_out_of_memory_message)
TEST(device_cuda_probe_says_why)
TEST(device_cuda_round_trips)
TEST(device_choose_rules)
TEST(device_selection_public)

/* runtime: which process of which job, test_launch.c */
TEST(launch_none_is_one_process)
TEST(launch_order_first_match_wins)
TEST(launch_bad_variables_are_errors)
