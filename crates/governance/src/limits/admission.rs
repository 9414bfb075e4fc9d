//! What an admitted request holds: [`Admission`] (settled when the response ends, or dropped
//! to give everything back) and a streamed upload's [`Upload`] reservations.

use super::*;

impl Upload {
    /// Whether `len` more bytes fit in what every budget has reserved (no store call).
    pub fn fits(&self, len: u64) -> bool {
        let after = self.sent.load(Ordering::Relaxed) + len;
        self.budgets
            .iter()
            .all(|b| b.reserved.load(Ordering::Relaxed) >= after)
    }

    /// Accounts `len` bytes about to be sent, reserving more of each budget first if they do
    /// not fit; a refusal (`budget_exhausted`, or `limits_unavailable` when the store cannot
    /// answer) when a budget has no room left. The bytes count as sent on success only.
    pub async fn send(&self, len: u64) -> Result<(), Refusal> {
        let after = self.sent.load(Ordering::Relaxed) + len;
        for b in &self.budgets {
            while b.reserved.load(Ordering::Relaxed) < after {
                let need = (after - b.reserved.load(Ordering::Relaxed)).max(upload_block(b.cap));
                let cap = i64::try_from(b.cap).unwrap_or(i64::MAX);
                let want = i64::try_from(need).unwrap_or(i64::MAX);
                let added = self
                    .limiter
                    .reserve(&b.store_key, want, cap, b.ttl_until)
                    .await;
                let got = match added {
                    Ok(Added::Ok(_)) => need,
                    Ok(Added::Over(current)) => {
                        let left = cap.saturating_sub(current).max(0) as u64;
                        let short = after - b.reserved.load(Ordering::Relaxed);
                        if left < short {
                            *lock(&self.cut) = Some(b.store_key.clone());
                            return Err(Refusal::new(
                                Reason::BudgetExhausted,
                                format!(
                                    "limit {:?}: bytes_up budget for {} ({} bytes) used up during this upload; it was cut off",
                                    b.limit, b.display, b.cap
                                ),
                            ));
                        }
                        match self
                            .limiter
                            .reserve(&b.store_key, left as i64, cap, b.ttl_until)
                            .await
                        {
                            Ok(Added::Ok(_)) => left,
                            Ok(Added::Over(_)) => continue,
                            Err(e) => return Err(upload_store_error(&b.limit, &e)),
                        }
                    }
                    Err(e) => return Err(upload_store_error(&b.limit, &e)),
                };
                b.reserved.fetch_add(got, Ordering::Relaxed);
            }
        }
        self.sent.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    /// Accounts `len` bytes that fit (after [`Upload::fits`]).
    pub fn sent(&self, len: u64) {
        self.sent.fetch_add(len, Ordering::Relaxed);
    }
}

pub(super) fn upload_store_error(limit: &str, e: &StateError) -> Refusal {
    Refusal::new(
        Reason::LimitsUnavailable,
        format!("limit {limit:?}: {e}; the upload was cut off (the limit fails closed)"),
    )
}

impl Admission {
    /// The charges so far, for the record.
    pub fn charges(&self) -> &[LimitCharge] {
        &self.charges
    }

    /// `x-ratelimit-*` values from the tightest request bucket charged, if any.
    pub fn rate(&self) -> Option<RateHeaders> {
        self.rate
    }

    /// The `bytes_up` reservations of a streamed upload, to wrap its body with.
    pub fn upload(&self) -> Option<Arc<Upload>> {
        self.upload.clone()
    }

    /// The model-provider call this admission reserved for, if any.
    pub fn llm(&self) -> Option<&LlmEstimate> {
        self.llm.as_ref()
    }

    /// A refusal: everything taken so far is given back (by dropping `self`).
    pub(super) fn refuse(
        self,
        reason: Reason,
        message: String,
        retry_after: Option<u64>,
    ) -> Box<Refused> {
        let refused = Refused {
            refusal: Refusal::new(reason, message),
            retry_after,
            rate: self.rate,
            charges: self.charges.clone(),
        };
        drop(self);
        Box::new(refused)
    }

    /// A store error under `limit`: fail closed, or (`on_store_error = "allow"`) go on and
    /// mark the measure unchecked.
    pub(super) fn store_failed(
        &mut self,
        limit: &Limit,
        charge: LimitCharge,
        e: &StateError,
    ) -> Result<LimitCharge, Box<Refused>> {
        if limit.on_store_error == OnStoreError::Allow {
            tracing::warn!(limit = %limit.name, error = %e, "limit not checked: the state store cannot answer and the limit allows that");
            return Ok(LimitCharge {
                unchecked: true,
                ..charge
            });
        }
        let mut this = std::mem::replace(self, Admission::empty(self.limiter.clone()));
        this.charges.push(LimitCharge {
            refused: true,
            ..charge
        });
        Err(this.refuse(
            Reason::LimitsUnavailable,
            format!(
                "limit {:?}: {e}; the limit fails closed (on_store_error = \"allow\" would let requests through unchecked)",
                limit.name
            ),
            Some(1),
        ))
    }

    pub(super) fn empty(limiter: Arc<Limiter>) -> Admission {
        Admission {
            limiter,
            head_up: 0,
            held: Vec::new(),
            slots: Vec::new(),
            charges: Vec::new(),
            rate: None,
            upload: None,
            llm: None,
            settled: true,
        }
    }

    /// Charges what the request used: its request bytes and, for a model-provider call, the
    /// tokens and money its response reported. `status` is the upstream's (`None`: no
    /// response came). Without usage, a call that got a successful response is charged its
    /// reservation (it may have been billed); one that failed gets it back. Returns the charges
    /// and the usage for the record; the store is updated in the background.
    pub fn settle(
        mut self,
        bytes_up: u64,
        status: Option<u16>,
        usage: Option<&Usage>,
        prices: &PriceTable,
    ) -> (Vec<LimitCharge>, Option<UsageInfo>) {
        self.settled = true;
        let success = status.is_some_and(|s| (200..300).contains(&s));
        let llm = self.llm.take();
        let info = llm
            .as_ref()
            .and_then(|l| usage_info(l, usage, success, prices));
        let mut adjustments = Vec::new();
        for held in std::mem::take(&mut self.held) {
            let actual = match held.measure {
                // A streamed upload counts what it let through (its head included), not what
                // was read.
                Measure::BytesUp => Some(match (held.upload, &self.upload) {
                    (Some(_), Some(u)) => u.sent.load(Ordering::Relaxed),
                    _ => self.head_up.saturating_add(bytes_up),
                }),
                Measure::LlmTokens => match (&info, success) {
                    (Some(i), _) => Some(i.input_tokens + i.output_tokens),
                    (None, _) => Some(0),
                },
                Measure::Spend => match &info {
                    // The cost was whole micro-dollars before it became USD.
                    Some(i) => Some(i.cost.map_or(held.reserved, |c| (c * 1e6).round() as u64)),
                    None => Some(0),
                },
                _ => None,
            };
            let Some(actual) = actual else { continue };
            let reserved = upload_reserved(&held, self.upload.as_deref());
            let cut = self
                .upload
                .as_ref()
                .is_some_and(|u| lock(&u.cut).as_deref() == Some(held.store_key.as_str()));
            if let Some(c) = self.charges.get_mut(held.charge) {
                c.charged = actual;
                // The counter after admission held the first reservation; a stream's later
                // blocks and this settle moved it to `used + actual - first`.
                c.used = (c.used + actual).saturating_sub(held.reserved);
                c.refused |= cut;
            }
            let delta = i64::try_from(actual).unwrap_or(i64::MAX)
                - i64::try_from(reserved).unwrap_or(i64::MAX);
            adjustments.push((held, delta, reserved));
        }
        for c in &self.charges {
            self.limiter.note(c, None, None);
        }
        let limiter = self.limiter.clone();
        // Embedded: the counters are in memory (loaded when reserved), so settle now. A
        // reservation stops being in flight once its counter is settled.
        adjustments.retain(|(held, delta, reserved)| {
            let now = limiter.adjust_now(&held.store_key, *delta);
            if now {
                limiter.release(&held.store_key, *reserved);
            }
            !now
        });
        if !adjustments.is_empty() {
            tokio::spawn(async move {
                for (held, delta, reserved) in adjustments {
                    if let Err(e) = limiter.adjust(&held.store_key, delta, held.ttl_until).await {
                        tracing::warn!(limit = %held.limit, error = %e, "cannot settle a limit's reservation");
                    }
                    limiter.release(&held.store_key, reserved);
                }
            });
        }
        (std::mem::take(&mut self.charges), info)
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        for slot in self.slots.drain(..) {
            if let Slot::Shared { stop, .. } = slot {
                stop.notify_one();
            }
        }
        if self.settled || self.held.is_empty() {
            return;
        }
        // Failed before any response: every reservation goes back (what a streamed upload
        // already sent stays charged: those bytes left).
        let upload = self.upload.clone();
        let limiter = self.limiter.clone();
        let mut rest = Vec::new();
        for h in std::mem::take(&mut self.held) {
            let reserved = upload_reserved(&h, upload.as_deref());
            let sent = match (h.upload, &upload) {
                (Some(_), Some(u)) => u.sent.load(Ordering::Relaxed),
                _ => 0,
            };
            let delta = -(i64::try_from(reserved.saturating_sub(sent)).unwrap_or(i64::MAX));
            if limiter.adjust_now(&h.store_key, delta) {
                limiter.release(&h.store_key, reserved);
            } else {
                rest.push((h, delta, reserved));
            }
        }
        if rest.is_empty() {
            return;
        }
        let give_back = async move {
            for (h, delta, reserved) in rest {
                if let Err(e) = limiter.adjust(&h.store_key, delta, h.ttl_until).await {
                    tracing::warn!(limit = %h.limit, error = %e, "cannot return a limit's reservation");
                }
                limiter.release(&h.store_key, reserved);
            }
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(give_back);
        }
    }
}

/// What a held reservation amounts to now (a streamed upload reserves as it goes).
pub(super) fn upload_reserved(held: &Held, upload: Option<&Upload>) -> u64 {
    match (held.upload, upload) {
        (Some(i), Some(u)) => u
            .budgets
            .get(i)
            .map_or(held.reserved, |b| b.reserved.load(Ordering::Relaxed)),
        _ => held.reserved,
    }
}
