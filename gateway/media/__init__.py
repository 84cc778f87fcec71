"""Images for vision models, in the gateway: fetched safely, decoded, and preprocessed as each model's own
processor does, so the engine receives pixel tensors and the prompt its placeholder tokens.

    config.MediaConfig      what may be fetched (--media-allowed-hosts) and every bound: bytes, pixels,
                            images per request, time, cache, threads
    fetch.MediaFetcher      data: URIs, and http(s) URLs only to allowed hosts, never to private addresses
                            unless listed, redirects checked again, bounded; cached by URL
    decode                  bytes to an RGB image: allowed formats only, the pixel bound checked before a
                            decompression, as vLLM converts them (RGBA over white)
    processors, llama4,     per model family (Qwen2-VL / 2.5-VL / 3-VL, LLaVA, Gemma 3, Pixtral, Llama 4,
    internvl, idefics3      InternVL, Idefics3 / SmolVLM):
                            resize, rescale, normalize, patches, tiles and grids, the placeholder's expansion;
                            chosen from the engine's own preprocessor_config.json (families.IMAGE_PROCESSORS)
    video                   videos (Qwen2-VL, Qwen2.5-VL): JPEG frame lists, and files decoded by OpenCV's FFmpeg
                            in a child process per file; the frames vLLM's loader samples; the video processor
    inputs                  a request's images and videos, processed: the tensors the engine takes, the expanded
                            prompt, the placeholder ranges, the hashes that key caches and KV routing
"""
