from concur.extract import extract, last_python_block, split_reasoning

FENCE = "```"


def block(body, tag="python"):
    return f"{FENCE}{tag}\n{body}\n{FENCE}\n"


def test_think_tags_split_reasoning_from_answer():
    out = extract(f"<think>\nplan the kernel\n</think>\n\nHere it is.\n{block('x = 1')}")
    assert out.reasoning == "plan the kernel"
    assert out.answer.startswith("Here it is.")
    assert out.code == "x = 1\n"


def test_last_python_block_wins_and_other_languages_are_skipped():
    answer = f"first\n{block('a = 1')}\n{block('int x;', 'cpp')}\n{block('b = 2', 'py')}\n{block('// cuda', 'cuda')}"
    assert last_python_block(answer) == "b = 2\n"


def test_untagged_fence_counts_as_python():
    assert last_python_block(f"text\n{block('c = 3', '')}") == "c = 3\n"


def test_code_inside_reasoning_is_never_taken():
    out = extract(f"<think>\ndraft:\n{block('draft = 1')}</think>\n\nNo final code, sorry.")
    assert "draft = 1" in out.reasoning
    assert out.code == ""


def test_no_code_block():
    out = extract("<think>short</think>Just prose.")
    assert (out.reasoning, out.answer, out.code) == ("short", "Just prose.", "")


def test_only_closing_tag_means_template_opened_the_think_block():
    reasoning, answer = split_reasoning("I reason here\n</think>\nanswer text")
    assert (reasoning, answer) == ("I reason here", "answer text")


def test_truncated_inside_reasoning_has_no_answer_and_no_code():
    out = extract(f"<think>still thinking\n{block('partial = 1')}")
    assert out.answer == "" and out.code == ""
    assert out.reasoning.startswith("still thinking")


def test_no_tags_is_all_answer():
    out = extract(f"plain answer\n{block('y = 2')}")
    assert out.reasoning == "" and out.code == "y = 2\n"


def test_separate_reasoning_field_is_used_verbatim():
    out = extract(f"final\n{block('z = 3')}", reasoning="  backend reasoning ")
    assert out.reasoning == "backend reasoning"
    assert out.code == "z = 3\n"


def test_unclosed_fence_is_not_a_block():
    assert last_python_block(f"{FENCE}python\nnever closed") == ""
