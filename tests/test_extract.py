"""Reading responses in every shape reasoning models and their servers emit (fixtures written here, shaped like real
QwQ / DeepSeek-R1 / Qwen3 output on KernelBench prompts)."""

from concur.extract import extract, last_python_block, program_block, split_tagged

FENCE = "```"

PROGRAM = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = """
__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
"""

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)
'''
DRAFT = "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x  # draft\n"
THINKING = (
    "Okay, so I need to write a CUDA kernel for ReLU. Let me think about the memory access pattern.\n\n"
    "Each thread handles one element; a grid-stride loop would help for big tensors.\n\n"
    "Wait, the input is float32, so I can also vectorise with float4.\n"
)


def block(body, tag="python"):
    return f"{FENCE}{tag}\n{body}{FENCE}\n"


def test_both_tags_split_reasoning_from_answer():
    out = extract(f"<think>\n{THINKING}</think>\n\nHere is the kernel.\n\n{block(PROGRAM)}")
    assert out.reasoning == THINKING.strip()
    assert out.answer.startswith("Here is the kernel.")
    assert out.code == PROGRAM
    assert (out.reasoning_source, out.code_source, out.unclosed) == ("tags", "answer", False)


def test_closing_tag_only_reasoning_counts_from_the_start():
    """Chat templates that open the block themselves (QwQ, DeepSeek-R1): only </think> is generated."""
    out = extract(f"{THINKING}</think>\n\n{block(PROGRAM)}")
    assert out.reasoning == THINKING.strip()
    assert (out.reasoning_source, out.code) == ("close_tag", PROGRAM)


def test_backend_reasoning_field_is_used_and_tags_in_the_content_are_added_to_it():
    out = extract(f"Final answer:\n{block(PROGRAM)}", reasoning=f"  {THINKING}  ")
    assert (out.reasoning, out.reasoning_source, out.code) == (THINKING.strip(), "field", PROGRAM)
    both = extract(f"late thought</think>\n{block(PROGRAM)}", reasoning="field thought")
    assert both.reasoning == "field thought\n\nlate thought" and both.answer.startswith(FENCE)


def test_final_program_written_inside_the_reasoning_with_only_prose_after():
    response = f"<think>\n{THINKING}\nSo the final code:\n{block(PROGRAM)}\nThat should work.\n</think>\n\n" + (
        "The kernel above uses one thread per element and should beat PyTorch for large inputs."
    )
    out = extract(response)
    assert out.code == PROGRAM
    assert (out.reasoning_source, out.code_source) == ("tags", "reasoning")
    assert "That should work." in out.reasoning and out.answer.startswith("The kernel above")


def test_program_is_picked_by_what_it_is_not_by_position():
    """Several blocks in the answer, with a shell command and a comment block after the real program."""
    answer = (
        f"{block(PROGRAM)}\nTo test it:\n{block('python run.py', 'bash')}\n"
        f"Usage notes:\n{block('# call ModelNew()(x) as you would Model', '')}"
    )
    out = extract(f"{THINKING}</think>\n{answer}")
    assert out.code == PROGRAM and out.code_source == "answer"


def test_a_complete_program_wins_over_a_later_fragment_that_does_not_parse():
    fragment = "class ModelNew(nn.Module):\n    def forward(self, x):\n        ...  as above\n        return y)\n"
    assert program_block(f"{block(PROGRAM)}\nand in short:\n{block(fragment)}").body == PROGRAM


def test_answer_program_wins_over_a_draft_in_the_reasoning():
    out = extract(f"<think>first try:\n{block(DRAFT)}</think>\n{block(PROGRAM)}")
    assert out.code == PROGRAM and out.code_source == "answer"


def test_without_a_modelnew_block_the_answers_last_python_block_stands_in():
    x, cpp = block("x = 1\n"), block("int main() {}\n", "cpp")
    out = extract(f"<think>hm</think>\n{x}\n{cpp}")
    assert out.code == "x = 1\n" and out.code_source == "answer"
    assert extract("<think>short</think>Just prose.").code == ""


def test_untagged_raw_completion_split_at_the_final_answer_marker():
    response = (
        f"{THINKING}\nLet me write a draft:\n{block(DRAFT)}\nHmm, the draft is wrong.\n\n**Final Answer**\n\n"
        + (f"{block(PROGRAM)}\nThis uses a simple elementwise kernel.")
    )
    out = extract(response)
    assert out.reasoning_source == "inferred"
    assert out.reasoning.endswith("Hmm, the draft is wrong.") and "draft" in out.reasoning
    assert out.answer.startswith("**Final Answer**") and out.code == PROGRAM
    assert out.code_source == "answer" and not out.unclosed


def test_untagged_raw_completion_without_a_marker_splits_at_the_final_program():
    out = extract(f"{THINKING}\nThat settles it.\n{block(PROGRAM)}\nDone.")
    assert out.reasoning.endswith("That settles it.") and out.answer.startswith(FENCE)
    assert out.reasoning_source == "inferred"


def test_untagged_answer_without_reasoning_is_none():
    out = extract(f"Here is the optimized code:\n{block(PROGRAM)}")
    assert (out.reasoning, out.reasoning_source, out.code) == ("", "none", PROGRAM)


def test_untagged_response_cut_inside_a_fence_is_all_reasoning_and_flagged():
    out = extract(
        f"{THINKING}\nFirst attempt:\n{block(PROGRAM)}\nNow the vectorised one:\n{FENCE}python\nimport torch\n"
    )
    assert out.unclosed and out.answer == "" and out.reasoning_source == "inferred"
    assert out.code == PROGRAM and out.code_source == "reasoning"  # a draft: the truncation flag keeps it out


def test_untagged_response_reported_cut_never_reached_its_answer():
    out = extract(f"{THINKING}\n{block(PROGRAM)}\nBut wait, maybe", cut=True)
    assert out.answer == "" and out.reasoning.endswith("But wait, maybe")
    assert not out.unclosed  # nothing in the text shows it; the finish reason did


def test_opened_never_closed_is_cut_inside_the_reasoning():
    out = extract(f"<think>\n{THINKING}\n{block(DRAFT)}\nLet me also")
    assert (out.reasoning_source, out.unclosed, out.answer) == ("open_tag", True, "")
    assert out.code_source == "reasoning" and "draft" in out.code


def test_answer_cut_inside_its_program_fence():
    out = extract(f"<think>{THINKING}</think>\n{FENCE}python\nimport torch\nclass ModelNew(")
    assert out.unclosed and out.code == "" and out.reasoning_source == "tags"


def test_empty_think_block_is_a_split_with_no_reasoning():
    out = extract(f"<think>\n\n</think>\n\n{block(PROGRAM)}")
    assert (out.reasoning, out.reasoning_source, out.code) == ("", "tags", PROGRAM)


def test_the_last_closing_tag_ends_the_reasoning():
    tagged = split_tagged("<think>plan a</think> more <think>plan b</think>answer")
    assert tagged == ("plan a more plan b", "answer", "tags")


def test_unfenced_program_as_the_whole_answer():
    out = extract(f"<think>{THINKING}</think>\n{PROGRAM}")
    assert out.code == PROGRAM and out.code_source == "answer"


def test_unclosed_fence_is_not_a_block():
    assert last_python_block(f"{FENCE}python\nnever closed") == ""


def test_empty_response():
    out = extract("")
    assert (out.reasoning, out.answer, out.code, out.reasoning_source, out.unclosed) == ("", "", "", "none", False)


def test_a_stray_fence_before_prose_does_not_swallow_the_program():
    """Seen in raw QwQ completions: "``` To solve this problem, ..." opens nothing real, then the program follows,
    then a doubled closing fence and unrelated text."""
    response = (
        f"{THINKING}\n``` To solve this we replace the op.\n\nPlan first.\n\n{block(PROGRAM)}{FENCE}\n\nUnrelated."
    )
    out = extract(response)
    assert out.code == PROGRAM and not out.unclosed
    assert out.reasoning.endswith("Plan first.") and out.reasoning_source == "inferred"


def test_other_reasoning_delimiters_in_use():
    for open_, close in (("<thinking>", "</thinking>"), ("<|begin_of_thought|>", "<|end_of_thought|>")):
        out = extract(f"{open_}\n{THINKING}{close}\n{block(PROGRAM)}")
        assert (out.reasoning, out.reasoning_source, out.code) == (THINKING.strip(), "tags", PROGRAM)
    closing_only = extract(f"{THINKING}</reasoning>\n{block(PROGRAM)}")
    assert (closing_only.reasoning_source, closing_only.code_source) == ("close_tag", "answer")
    cut = extract(f"<thinking>{THINKING}")
    assert (cut.reasoning_source, cut.unclosed, cut.answer) == ("open_tag", True, "")
