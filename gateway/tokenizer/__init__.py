"""Text to token ids and back: ``service.TokenizerService`` (a Hugging Face tokenizer, its chat
template, the caches, the fast encoder and renderer where they agree with the reference) with its
``TokenizerConfig``; ``stop.StopMatcher`` for stop strings; ``bundled.default_tokenizer_dir`` for the
demo tokenizer. The other modules are the service's parts.
"""
