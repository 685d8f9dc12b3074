from typing_extensions import disjoint_base

@disjoint_base
class TransferEngine:
    chunk_bytes: int
    n_chunks: int
    copy_threads: int
    min_split: int
    stream_upload_max: int
    stream_readback_max: int
    min_window: int
    min_readback_window: int
    streamed_copy_mode: int
    ring_bytes: int
    pinned_alloc_calls: int
    closed: bool
    def __init__(
        self, ctx: int, chunk_bytes: int = ..., n_chunks: int = ..., copy_threads: int = ..., min_split: int = ...
    ) -> None: ...
    @property
    def live_threads(self) -> int: ...
    @property
    def parallel_jobs(self) -> int: ...
    def free_slots(self) -> int: ...
    def forget_context(self) -> None: ...
    def stop_threads(self) -> None: ...
    def close(self) -> None: ...
