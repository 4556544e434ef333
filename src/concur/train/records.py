"""Tokenisation and loss masking of the SFT records, by our own code, to check what TRL does with the same records.

Each record goes to the trainer as a conversational prompt/completion pair (the user turn, then the assistant
turn), so TRL tokenises both with the model's chat template and puts the loss on the completion only. TRL only
warns when the tokens of the prompt are not a prefix of the tokens of the whole conversation, and then trains on a
context generation never sees: `masked_example` refuses such a template, `select_records` drops the records whose
prompt alone fills `max_length`, and the trainer checks that TRL labelled exactly the tokens counted here.
"""

from __future__ import annotations

IGNORE_INDEX = -100  # label value the cross-entropy loss skips


def masked_example(tokenizer, messages: list[dict], max_length: int) -> dict[str, list[int]]:
    """input_ids / labels / attention_mask of one conversation; labels are -100 except on the last (assistant) turn.

    Truncated to `max_length` tokens, keeping the start; when the prompt alone fills it, no label is left.
    """
    _check_messages(messages)
    prompt_ids = chat_ids(tokenizer, messages[:-1], add_generation_prompt=True)
    full_ids = chat_ids(tokenizer, messages, add_generation_prompt=False)
    if full_ids[: len(prompt_ids)] != prompt_ids:
        raise ValueError(
            "chat template: the tokens of the prompt (with the generation prompt) are not a prefix of the tokens of "
            "the full conversation, so the assistant part cannot be masked; use a template that renders the "
            "assistant turn after the generation prompt unchanged"
        )
    input_ids = full_ids[:max_length]
    n_prompt = min(len(prompt_ids), len(input_ids))
    labels = [IGNORE_INDEX] * n_prompt + input_ids[n_prompt:]
    return {"input_ids": input_ids, "labels": labels, "attention_mask": [1] * len(input_ids)}


def chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=True
    )
    return list(encoded["input_ids"])


def _check_messages(messages: list[dict]) -> None:
    if not isinstance(messages, list) or len(messages) < 2:
        raise ValueError(
            f"messages: expected a list of at least 2 turns ending with the assistant, got {messages!r:.80}"
        )
    if messages[-1].get("role") != "assistant":
        raise ValueError(f"messages: the last turn must have role 'assistant', not {messages[-1].get('role')!r}")


def select_records(records: list[dict], tokenizer, max_length: int) -> tuple[list[dict], list[dict], int]:
    """The records that keep at least one target token within max_length, their masked examples, and how many not."""
    kept, examples, n_dropped = [], [], 0
    for index, record in enumerate(records):
        try:
            example = masked_example(tokenizer, record["messages"], max_length)
        except (KeyError, ValueError) as error:
            raise ValueError(f"SFT record {record.get('candidate_id', index)!r}: {error}") from None
        if n_target_tokens(example) == 0:
            n_dropped += 1
        else:
            kept.append(record)
            examples.append(example)
    return kept, examples, n_dropped


def n_target_tokens(example: dict) -> int:
    return sum(label != IGNORE_INDEX for label in example["labels"])


def prompt_completion(record: dict) -> dict:
    """A record as TRL's conversational prompt/completion pair: the loss goes on the completion (assistant) turn."""
    return {"prompt": list(record["messages"][:-1]), "completion": [record["messages"][-1]]}
