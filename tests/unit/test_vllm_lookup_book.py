"""The vLLM tier's lookup verdicts (integrations/vllm/lookups.py): one probe per key per
step, answers applied by generation, verdicts kept per request and refreshed for new ones."""

from lmcache_valkey.integrations.vllm.lookups import LookupBook


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def answer(book: LookupBook, found: dict[bytes, bool]) -> None:
    book.resolve((k, g, found[k]) for k, g in book.take_batch())


def test_a_key_is_unknown_until_its_batch_is_answered() -> None:
    book = LookupBook()
    assert book.lookup(b"k1", "r1") is None
    assert book.lookup(b"k2", "r1") is None
    assert book.lookup(b"k1", "r1") is None  # asked again in the same step: still one probe
    batch = book.take_batch()
    assert [k for k, _ in batch] == [b"k1", b"k2"]
    assert book.in_flight() == 2 and book.take_batch() == []
    book.resolve([(k, g, k == b"k1") for k, g in batch])
    assert book.lookup(b"k1", "r1") is True and book.lookup(b"k2", "r1") is False


def test_requests_of_the_same_step_share_one_probe() -> None:
    book = LookupBook()
    book.lookup(b"k", "r1")
    book.lookup(b"k", "r2")
    assert len(book.take_batch()) == 1


def test_a_new_request_asks_again_once_the_verdict_is_old() -> None:
    clock = Clock()
    book = LookupBook(reuse_s=1.0, clock=clock)
    book.lookup(b"k", "long-running")
    answer(book, {b"k": False})
    clock.now += 0.5
    assert book.lookup(b"k", "soon-after") is False  # fresh: reused, no probe
    assert book.take_batch() == []
    clock.now += 5
    assert book.lookup(b"k", "later") is None  # another server may have stored it since
    answer(book, {b"k": True})
    assert book.lookup(b"k", "later") is True
    assert book.lookup(b"k", "long-running") is True


def test_an_answer_for_a_superseded_probe_is_ignored() -> None:
    clock = Clock()
    book = LookupBook(reuse_s=1.0, clock=clock)
    book.lookup(b"k", "r1")
    old = book.take_batch()
    book.release("r1")  # in flight: kept until its answer arrives
    assert book.in_flight() == 1
    book.resolve([(k, g, True) for k, g in old])  # nobody wants it any more: dropped
    assert len(book) == 0
    book.lookup(b"k", "r2")
    new = book.take_batch()
    book.resolve([(k, g, True) for k, g in old])  # a stale generation changes nothing
    assert book.lookup(b"k", "r2") is None
    book.resolve([(k, g, False) for k, g in new])
    assert book.lookup(b"k", "r2") is False


def test_a_released_key_is_not_sent() -> None:
    book = LookupBook()
    book.lookup(b"k", "r1")
    book.release("r1")
    assert book.take_batch() == [] and len(book) == 0


def test_a_failed_load_turns_a_hit_into_a_miss_and_a_store_into_a_hit() -> None:
    book = LookupBook()
    book.lookup(b"a", "r")
    book.lookup(b"b", "r")
    answer(book, {b"a": True, b"b": False})
    book.mark([b"a"], False)
    book.mark([b"b"], True)
    assert book.lookup(b"a", "r") is False and book.lookup(b"b", "r") is True
    book.lookup(b"c", "r")
    book.mark([b"c"], True)  # still pending: its own answer decides
    answer(book, {b"c": False})
    assert book.lookup(b"c", "r") is False


def test_only_a_fresh_hit_lets_a_store_be_skipped() -> None:
    clock = Clock()
    book = LookupBook(reuse_s=1.0, clock=clock)
    book.lookup(b"k", "r")
    assert not book.known_present(b"k")
    answer(book, {b"k": True})
    assert book.known_present(b"k")
    clock.now += 5
    assert not book.known_present(b"k")  # maybe evicted since: send it
