"""The serving core: generations on engines, the models served, admission, embeddings, PD pairs."""
