"""concur: curate LLM-written kernels with reasoning traces, fine-tune on them, score on KernelBench."""

__version__ = "0.1.0"
