rule train:
    """LoRA SFT of the base model on one curated table (the ConCuR dataset or an ablation subset)."""
    input:
        adapter_dataset,
    output:
        directory(results("adapters", "{adapter}")),
    params:
        settings=config["train"],
        model=config["models"][config["train"]["base_model"]],
    log:
        log_path("train", "{adapter}"),
    benchmark:
        benchmark_path("train", "{adapter}")
    conda:
        "../envs/torch.yaml"
    threads: max(2, 4 * gpus("train"))
    resources:
        gpu=gpus("train"),
        mem_mb=16000 + 32000 * gpus("train"),  # host memory to load a large model's weights, per GPU
        runtime=48 * 60,
    script:
        "../scripts/train.py"
