"""The synthetic projectors the tests use live with the image bench (``bench.synthetic_projector``)."""

from localchat.bench.synthetic_projector import (  # noqa: F401
    token_embeddings,
    write_colour_projector,
    write_mlp_projector,
)
