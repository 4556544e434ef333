# Refinement turns (synthesize.turns > 1): turn k of every shard's trajectories, from the shard's earlier turns and
# turn k-1's verdicts, then built and verified like turn 1. One job per shard and turn: the DAG is static.


rule refine:
    """Every turn k-1 version of one shard that is not yet correct and fast enough (synthesize.stop_speedup) is asked
    again, in its trajectory's chat followed by the verifier's feedback (resumable like synthesize)."""
    input:
        tasks=results("tasks", "train.parquet"),
        generations=replay_file,
        history=lambda wc: [turn_file("candidates", wc.generator, wc.shard, t) for t in range(1, int(wc.turn))],
        verified=lambda wc: turn_file("verified", wc.generator, wc.shard, int(wc.turn) - 1),
    output:
        candidates=results("candidates", "{generator}", "turn-{turn}", "shard-{shard}.parquet"),
        report=results("candidates", "{generator}", "turn-{turn}", "shard-{shard}.report.csv"),
    params:
        settings=concur_workflow.refine_settings(config),
        generator=lambda wc: concur_workflow.generator_params(config, wc.generator),  # a moved server reruns nothing
        models=config["models"],
        shards=len(SHARDS),
    log:
        log_path("refine", "{generator}", "turn-{turn}", "shard-{shard}"),
    benchmark:
        benchmark_path("refine", "{generator}", "turn-{turn}", "shard-{shard}")
    conda:
        "../envs/torch.yaml"
    threads: model_job_threads(gpus("synthesize"))
    resources:
        **model_job_resources(gpus("synthesize"), mem_mb=8000, runtime=24 * 60),
    script:
        "../scripts/refine.py"


# a turn's extensions, built into the shared build cache (a CPU job)
use rule compile as refine_compile with:
    input:
        candidates=results("candidates", "{generator}", "turn-{turn}", "shard-{shard}.parquet"),
        tasks=results("tasks", "train.parquet"),
    output:
        results("builds", "{generator}", "turn-{turn}", "shard-{shard}.parquet"),
    params:
        workdir=lambda wc: results("scratch", "compile", wc.generator, f"turn-{wc.turn}", f"shard-{wc.shard}"),
    log:
        log_path("compile", "{generator}", "turn-{turn}", "shard-{shard}"),
    benchmark:
        benchmark_path("compile", "{generator}", "turn-{turn}", "shard-{shard}")


# the same verifier as turn 1's
use rule verify as refine_verify with:
    input:
        candidates=results("candidates", "{generator}", "turn-{turn}", "shard-{shard}.parquet"),
        builds=results("builds", "{generator}", "turn-{turn}", "shard-{shard}.parquet"),
        tasks=results("tasks", "train.parquet"),
    output:
        results("verified", "{generator}", "turn-{turn}", "shard-{shard}.parquet"),
    params:
        workdir=lambda wc: results("scratch", "verify", wc.generator, f"turn-{wc.turn}", f"shard-{wc.shard}"),
    log:
        log_path("verify", "{generator}", "turn-{turn}", "shard-{shard}"),
    benchmark:
        benchmark_path("verify", "{generator}", "turn-{turn}", "shard-{shard}")
