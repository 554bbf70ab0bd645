"""The model side: what a decoder is to the strategy and the engines, and the tensors around it.

    modeling.py   build_causal_lm, load_causal_lm, causal_lm_config; CausalLMWithLogProbs and
                  CausalLMWithValueHead (the heads the strategy trains); decoder_layers,
                  enable_gradient_checkpointing
    attention.py  packed (varlen) attention and the path chosen per device and dtype
    logprobs.py   chunked_log_probs: token log-probs and entropy without the [tokens, vocab] logits
    compiling.py  compile_decoder_layers (model.compile_layers)
    packing.py    balancing, token-budget groups, packing and unpacking of rows
    tokenizer.py  load_tokenizer, build_char_tokenizer
    files.py      where a model or tokenizer comes from (a folder or a hub id)
    weights.py    FlatWeights: a state dict as one buffer per dtype, for the weight sync

Nothing is imported here: importing a module of the package loads only what that module needs
(transformers' model classes cost seconds per process).
"""
