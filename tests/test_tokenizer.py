"""The tiny model's tokenizer: exact round trips of every official quiz
and gold answer with no unknown token, single-token tags, special tokens, save/load."""
from transformers import AutoTokenizer

from lopti_minimal.task import kk, prompts
from lopti_minimal.tokenizer import BOS, EOS, PAD, TAGS, build_tokenizer


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_official_quizzes_and_answers_round_trip(kk_tokenizer):
    tok = kk_tokenizer
    official = kk.load_official()
    assert len(official) == 500
    for r in official:
        for text in (r["quiz"], r["solution_text_format"], prompts.compact_prompt(r["quiz"]),
                     prompts.target_response(r, "compact")):
            ids = _ids(tok, text)
            assert tok.unk_token_id is None or tok.unk_token_id not in ids
            assert max(ids) < len(tok)
            assert tok.decode(ids) == text


def test_tags_are_single_tokens_and_survive_decoding(kk_tokenizer):
    tok = kk_tokenizer
    for tag in TAGS:
        assert len(_ids(tok, tag)) == 1, tag
    text = "<think>\nx\n</think>\n<answer> (1) Zoey is a knight </answer>"
    ids = _ids(tok, text)
    assert sum(i in tok.convert_tokens_to_ids(TAGS) for i in ids) == 4
    # Tags are not "special": skip_special_tokens must keep them (the reward needs them).
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_special_tokens_bos_eos_pad(kk_tokenizer):
    tok = kk_tokenizer
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (BOS, EOS, PAD)
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3   # pad != eos
    ids = tok("Amelia")["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.bos_token_id not in _ids(tok, "Amelia")
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == "Amelia"
    assert tok.padding_side == "left"


def test_vocabulary_is_small_and_names_are_whole_tokens(kk_tokenizer):
    tok = kk_tokenizer
    assert 300 <= len(tok) <= 1100
    for name in kk.COMMON_NAMES:
        assert len(_ids(tok, " " + name)) == 1, name
    for word in (" knight", " knave", " T", " F", " ok", " bad"):
        assert len(_ids(tok, word)) == 1, word


def test_any_text_round_trips_byte_level():
    tok = build_tokenizer(["A knight and a knave."] * 10, vocab_size=300)
    for text in ("Zoë said “hi” 🙂\t\n  twice", "<think>\n</think>", "", " leading space"):
        assert tok.decode(_ids(tok, text)) == text


def test_save_and_load_with_autotokenizer(kk_tokenizer, tmp_path):
    kk_tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    r = kk.load_official([4])[0]
    text = prompts.compact_prompt(r["quiz"]) + prompts.target_response(r, "compact")
    assert loaded(text)["input_ids"] == kk_tokenizer(text)["input_ids"]
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == \
        (kk_tokenizer.bos_token_id, kk_tokenizer.eos_token_id, kk_tokenizer.pad_token_id)
    assert loaded.padding_side == "left" and len(loaded) == len(kk_tokenizer)
    assert loaded.decode(loaded(text, add_special_tokens=False)["input_ids"]) == text
