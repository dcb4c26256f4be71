from tests.support.storage import config, other_storage, storage

__all__ = ["config", "other_storage", "storage"]
