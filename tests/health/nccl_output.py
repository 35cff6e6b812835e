"""TEST FAKE output: what nccl-tests' all_reduce_perf prints for the agent's one-size run
(`-b 1G -e 1G -g N`), laid out as NVIDIA/nccl-tests src/util.cu prints it: the column header
(writeResultHeader), one row for 1 GiB (out of place, then in place), and the summary lines
(writeResultFooter), whose "Avg bus bandwidth" is the mean of the two placements' busbw, as
src/common.cu computes it. tests/health/fake_host_bin/all_reduce_perf prints the same layout."""

from __future__ import annotations

ONE_GIB = 1 << 30


def all_reduce_perf(in_place: float, out_of_place: float | None = None, wrong: int = 0,
                    device: str = "NVIDIA H100 80GB HBM3") -> str:
    """The output of a run whose 1 GiB row has these busbw figures (GB/s)."""
    out_of_place = in_place if out_of_place is None else out_of_place
    elements = ONE_GIB // 4

    def half(busbw: float) -> str:
        # algbw = busbw * n / (2(n-1)) for 8 GPUs; time from algbw (bytes / GB/s -> us).
        algbw = busbw * 8 / 14
        time_us = ONE_GIB / algbw / 1e3 if algbw else 0.0
        return f"  {time_us:7.1f}  {algbw:6.2f}  {busbw:6.2f}  {wrong:6d}"

    return (
        f"#  Rank  0 Group  0 Pid 4242 on gpu-001 device  0 [0x18] {device}\n"
        "#\n"
        "#                                                              out-of-place                       in-place\n"
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong\n"
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)\n"
        f"{ONE_GIB:12d}  {elements:12d}     float     sum      -1{half(out_of_place)}{half(in_place)}\n"
        f"# Out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}\n"
        f"# Avg bus bandwidth    : {(in_place + out_of_place) / 2:g} \n"
        "#\n"
        "# Collective test concluded: all_reduce_perf\n"
    )
