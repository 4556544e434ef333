rule train:
    """LoRA SFT of the base model on one curated table (the ConCuR dataset or an ablation subset).

    TRL's SFTTrainer in this job's process on the CPU or one GPU; with train.gpus > 1 the job runs
    `accelerate launch --num_processes <train.gpus> --config_file configs/accelerate/<train.distributed>.yaml`.
    """
    input:
        adapter_dataset,
    output:
        adapter=directory(results("adapters", "{adapter}")),
        figure=report(
            results("figures", "train_loss_{adapter}.png"),
            caption="../report/train_loss.rst",
            category="Training",
            subcategory="{adapter}",
        ),
    params:
        settings=config["train"],
        model=config["models"][config["train"]["base_model"]],
    log:
        log_path("train", "{adapter}"),
    benchmark:
        benchmark_path("train", "{adapter}")
    conda:
        "../envs/torch.yaml"
    threads: model_job_threads(gpus("train"))
    resources:
        **model_job_resources(gpus("train"), mem_mb=16000, runtime=48 * 60),
    script:
        "../scripts/train.py"
