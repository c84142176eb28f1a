"""Broker settings of the transaction coordinator, with Kafka's names and defaults.

Every field is a broker setting (`server.properties` name in the comment) so tests can
shrink intervals while the defaults behave like Kafka 3.x/4.x
(TransactionStateManagerConfig / TransactionLogConfig).
"""

from __future__ import annotations

from dataclasses import dataclass

# transaction.state.log.num.partitions. Changing it after ids exist moves ids to other
# partitions (Kafka refuses to load when it changed; so must the broker).
TRANSACTION_STATE_PARTITIONS_DEFAULT = 50

# transaction.max.timeout.ms: a client asking for more gets INVALID_TRANSACTION_TIMEOUT, so
# one open transaction cannot hold read_committed consumers (the LSO) back for longer.
TRANSACTION_MAX_TIMEOUT_MS_DEFAULT = 15 * 60 * 1000

# transaction.two.phase.commit.enable (KIP-939): whether InitProducerId may ask for
# two-phase commit (enable2Pc); off, such a request gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
TRANSACTION_TWO_PHASE_COMMIT_ENABLE_DEFAULT = False

# transactional.id.expiration.ms: an id idle this long (in Empty/Complete*) is forgotten.
TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT = 7 * 24 * 60 * 60 * 1000

# transaction.abort.timed.out.transaction.cleanup.interval.ms: how often timed-out
# transactions are looked for (a transaction may live up to this much past its timeout).
ABORT_TIMED_OUT_CLEANUP_INTERVAL_MS_DEFAULT = 10_000

# transaction.remove.expired.transaction.cleanup.interval.ms
REMOVE_EXPIRED_CLEANUP_INTERVAL_MS_DEFAULT = 60 * 60 * 1000

# Kafka retries failed markers (and a Complete* append that found the log unavailable) on
# the marker sender's next round, paced by the inter-broker client's retry.backoff.ms.
RETRY_BACKOFF_MS_DEFAULT = 100

# max.message.bytes of Kafka's internal topics (1 MiB + record batch overhead): the
# tombstones of expired ids are written in batches no larger than this.
TOMBSTONE_BATCH_BYTES_MAX_DEFAULT = 1_048_588


@dataclass(frozen=True, slots=True)
class TxnConfig:
    """Kafka's setting names in the comments."""

    # transaction.state.log.num.partitions
    transaction_state_num_partitions: int = TRANSACTION_STATE_PARTITIONS_DEFAULT
    # transaction.max.timeout.ms
    transaction_max_timeout_ms: int = TRANSACTION_MAX_TIMEOUT_MS_DEFAULT
    # transaction.two.phase.commit.enable
    transaction_two_phase_commit_enable: bool = TRANSACTION_TWO_PHASE_COMMIT_ENABLE_DEFAULT
    # transactional.id.expiration.ms
    transactional_id_expiration_ms: int = TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT
    # transaction.abort.timed.out.transaction.cleanup.interval.ms
    abort_timed_out_cleanup_interval_ms: int = ABORT_TIMED_OUT_CLEANUP_INTERVAL_MS_DEFAULT
    # transaction.remove.expired.transaction.cleanup.interval.ms
    remove_expired_cleanup_interval_ms: int = REMOVE_EXPIRED_CLEANUP_INTERVAL_MS_DEFAULT
    # retry.backoff.ms of Kafka's marker sender
    retry_backoff_ms: int = RETRY_BACKOFF_MS_DEFAULT
    # max.message.bytes of __transaction_state (bounds one batch of tombstones)
    tombstone_batch_bytes_max: int = TOMBSTONE_BATCH_BYTES_MAX_DEFAULT

    def __post_init__(self) -> None:
        assert self.transaction_state_num_partitions >= 1
        assert self.transaction_max_timeout_ms >= 1
        assert self.transactional_id_expiration_ms >= 1
        assert self.abort_timed_out_cleanup_interval_ms >= 1
        assert self.remove_expired_cleanup_interval_ms >= 1
        assert self.retry_backoff_ms >= 0
        assert self.tombstone_batch_bytes_max >= 64 * 1024
