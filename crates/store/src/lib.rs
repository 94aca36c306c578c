//! Users, balances, holds, the ledger and token revocations in sled. The only crate that imports sled.
