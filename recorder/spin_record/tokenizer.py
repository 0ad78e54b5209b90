"""The model's tokenizer, rebuilt offline from the vocabulary and merges inside its GGUF file.

SmolLM2's tokenizer is GPT-2 style byte-level BPE (GGUF `tokenizer.ggml.model = gpt2`,
`tokenizer.ggml.pre = smollm`). llama.cpp's `smollm` pre-tokenizer splits every digit on its own
and then applies the GPT-2 regex, which is exactly Hugging Face's
Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)];
the decoder is ByteLevel. Control tokens (token_type 3: <|endoftext|>, <|im_start|>, ...) become
special tokens. No BOS is added (`tokenizer.ggml.add_bos_token = False`).
"""

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers


def from_gguf(gguf_path):
    import gguf

    r = gguf.GGUFReader(str(gguf_path))
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    pre = r.fields["tokenizer.ggml.pre"].contents()
    if r.fields["tokenizer.ggml.model"].contents() != "gpt2" or pre != "smollm":
        raise ValueError(f"{gguf_path}: tokenizer model/pre {pre!r} not supported (gpt2/smollm)")
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges],
                     fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if int(ty) == 3])
    return tok
