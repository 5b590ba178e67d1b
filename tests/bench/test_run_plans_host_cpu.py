"""bench/run_plans.py: the host's CPU use around each timed generate (other processes' cores, stolen cores)."""

from __future__ import annotations

import run_plans

STAT = "cpu  {user} 0 {system} {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1\n"


def test_host_cpu_sample_reads_the_aggregate_line():
    sample = run_plans.host_cpu_sample(STAT.format(user=70, system=30, idle=880, steal=20))
    assert sample is not None and sample[1] == (100, 20, 1000) and sample[2] > 0
    assert run_plans.host_cpu_sample("no cpu line here\n") is None


def test_host_cpu_cores_splits_ours_others_and_steal():
    """16 CPUs, 2 s: 1600 of 3200 jiffies busy = 8 cores, 6 of them ours (12 CPU-seconds): 2 others; 10 % stolen."""
    before = (10.0, (1000, 0, 10_000), 5.0)
    after = (12.0, (1000 + 1600, 320, 10_000 + 3200), 5.0 + 12.0)
    assert run_plans.host_cpu_cores(before, after, cpus=16) == {
        "wall_seconds": 2.0, "ours_cores": 6.0, "others_cores": 2.0, "steal_cores": 1.6}
    assert run_plans.host_cpu_cores(None, after) is None and run_plans.host_cpu_cores(after, before) is None


def test_a_live_sample_pair_is_sane():
    first = run_plans.host_cpu_sample()  # None without /proc/stat: then so is the result
    sum(i * i for i in range(200_000))
    cores = run_plans.host_cpu_cores(first, run_plans.host_cpu_sample())
    assert cores is None or (cores["ours_cores"] >= 0 and cores["others_cores"] >= 0)


def test_counters_delta_is_the_growth_of_the_counters_in_both():
    before = {"minor_faults": 10, "gpu_num_alloc_retries": 2, "pinned_num_host_alloc": 5}
    after = {"minor_faults": 14, "gpu_num_alloc_retries": 2, "pinned_num_host_alloc": 9, "new": 1}
    assert run_plans.counters_delta(before, after) == {
        "gpu_num_alloc_retries": 0, "minor_faults": 4, "pinned_num_host_alloc": 4}


def test_event_counters_see_fresh_pages_touched():
    """64 MiB of fresh anonymous memory (its own mmap: never pages the allocator already touched) written page by
    page: this process's minor page faults grow (by 16 384 pages of 4 KiB, or fewer with huge pages, never by none)."""
    import mmap

    size = 64 * 2**20
    before = run_plans.event_counters()
    with mmap.mmap(-1, size) as fresh:
        for offset in range(0, size, 4096):
            fresh[offset] = 1
        grown = run_plans.counters_delta(before, run_plans.event_counters())
    assert grown["minor_faults"] > 0 and grown["major_faults"] >= 0
