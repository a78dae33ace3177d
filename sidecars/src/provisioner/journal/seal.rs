//! Sealed journal entries: each intent is encrypted and authenticated
//! (AES-256-GCM) with a key only the provisioner's account reads, bound to
//! its entry's name.
//!
//! The journal is a ConfigMap: whoever may read ConfigMaps in the driver's
//! namespace would see every CreateVolume request (parameters, topology,
//! the claim), and whoever may write them could add an intent the sweep
//! then acts on with the provisioner's rights — CreateVolume and
//! DeleteVolume of a volume it names. Sealed, an entry tells a reader
//! nothing, and one not made with the key (or moved to another entry's
//! name) does not open, so the sweep never sees it.
//!
//! The key is 32 random bytes in the Secret [`key_secret_name`] beside the
//! journal, made by the first provisioner that opens the journal.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

/// What a sealed entry's value starts with.
pub const SEALED_PREFIX: &str = "sealed.v1:";
/// The key's field in its Secret.
pub const KEY_FIELD: &str = "key";
/// Length of the key.
pub const KEY_LEN: usize = 32;

/// The Secret holding the key of journal `journal` (a ConfigMap name, so
/// the result is a valid Secret name while the journal's is below 249
/// characters; [`super::node_journal_name`] keeps node journals at 253, so
/// the suffix replaces their end then).
pub fn key_secret_name(journal: &str) -> String {
    const SUFFIX: &str = "-key";
    let base: String = journal.chars().take(253 - SUFFIX.len()).collect();
    format!("{}{SUFFIX}", base.trim_end_matches(['-', '.']))
}

/// Why an entry does not open, or a key is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("the entry is not sealed")]
    NotSealed,
    #[error("the entry does not open with this journal's key (made without it, changed, or moved from another entry)")]
    Forged,
    #[error("the journal key has {0} bytes, not {KEY_LEN}")]
    KeyLength(usize),
    #[error("no random bytes from the system")]
    Random,
}

/// The key of one journal.
pub struct JournalKey {
    key: LessSafeKey,
    random: SystemRandom,
}

impl std::fmt::Debug for JournalKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JournalKey(..)")
    }
}

impl JournalKey {
    /// A new random key, with its bytes (for its Secret).
    pub fn generate() -> Result<(JournalKey, Vec<u8>), SealError> {
        let mut bytes = vec![0u8; KEY_LEN];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| SealError::Random)?;
        Ok((JournalKey::from_bytes(&bytes)?, bytes))
    }

    /// The key in `bytes` (its Secret's field).
    pub fn from_bytes(bytes: &[u8]) -> Result<JournalKey, SealError> {
        let unbound =
            UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| SealError::KeyLength(bytes.len()))?;
        Ok(JournalKey {
            key: LessSafeKey::new(unbound),
            random: SystemRandom::new(),
        })
    }

    /// `plaintext` sealed as the value of entry `entry`.
    pub fn seal(&self, entry: &str, plaintext: &[u8]) -> Result<String, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .map_err(|_| SealError::Random)?;
        let mut sealed = plaintext.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(entry.as_bytes()),
                &mut sealed,
            )
            .map_err(|_| SealError::Random)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(format!("{SEALED_PREFIX}{}", STANDARD.encode(out)))
    }

    /// The plaintext of entry `entry`'s `value`.
    pub fn open(&self, entry: &str, value: &str) -> Result<Vec<u8>, SealError> {
        let body = value
            .strip_prefix(SEALED_PREFIX)
            .ok_or(SealError::NotSealed)?;
        let mut bytes = STANDARD.decode(body).map_err(|_| SealError::Forged)?;
        if bytes.len() < NONCE_LEN {
            return Err(SealError::Forged);
        }
        let mut sealed = bytes.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&bytes).map_err(|_| SealError::Forged)?;
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(entry.as_bytes()), &mut sealed)
            .map_err(|_| SealError::Forged)?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_opens_only_with_its_key_under_its_name() {
        let (key, bytes) = JournalKey::generate().expect("key");
        assert_eq!(bytes.len(), KEY_LEN);
        let sealed = key.seal("pvc-1", b"{\"class\":\"fast\"}").expect("seal");
        assert!(sealed.starts_with(SEALED_PREFIX));
        assert!(
            !sealed.contains("fast"),
            "a reader learns nothing: {sealed}"
        );
        assert_eq!(
            key.open("pvc-1", &sealed).expect("opens"),
            b"{\"class\":\"fast\"}"
        );
        // The same key from its Secret's bytes.
        let again = JournalKey::from_bytes(&bytes).expect("key");
        assert!(again.open("pvc-1", &sealed).is_ok());
        // Moved to another entry, made with another key, changed, plain.
        assert_eq!(key.open("pvc-2", &sealed), Err(SealError::Forged));
        let (other, _) = JournalKey::generate().expect("key");
        assert_eq!(other.open("pvc-1", &sealed), Err(SealError::Forged));
        let mut tampered = sealed.clone();
        tampered.pop();
        tampered.push(if sealed.ends_with('A') { 'B' } else { 'A' });
        assert_eq!(key.open("pvc-1", &tampered), Err(SealError::Forged));
        assert_eq!(
            key.open("pvc-1", "{\"class\":\"fast\"}"),
            Err(SealError::NotSealed)
        );
        assert_eq!(key.open("pvc-1", "sealed.v1:!!"), Err(SealError::Forged));
        assert_eq!(key.open("pvc-1", "sealed.v1:"), Err(SealError::Forged));
        // Two seals of one entry differ (a fresh nonce each).
        assert_ne!(key.seal("pvc-1", b"x").ok(), key.seal("pvc-1", b"x").ok());
        assert_eq!(
            JournalKey::from_bytes(&[0; 16]).err(),
            Some(SealError::KeyLength(16))
        );
    }

    #[test]
    fn key_secret_names_stay_object_names() {
        assert_eq!(
            key_secret_name("csiops-provisioning-hostpath.csi"),
            "csiops-provisioning-hostpath.csi-key"
        );
        let long = "a".repeat(253);
        let name = key_secret_name(&long);
        assert_eq!(name.len(), 253);
        assert!(name.ends_with("-key"));
    }
}
