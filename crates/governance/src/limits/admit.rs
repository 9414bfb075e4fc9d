//! [`Limiter::admit`]: a request's rate buckets and concurrency slots first (a request refused
//! for its rate reserves nothing), then a reservation against each budget in its window.

use super::*;

/// What a budget reservation needs to know of the request.
struct Ask<'a> {
    key: &'a str,
    /// The host as the matching rule names it (`bytes_up` is counted per host).
    host: &'a str,
    estimate: &'a Estimate,
    now: SystemTime,
    started: Instant,
}

/// One budget a request reserves against: the limit, the measure and where it is counted.
struct Budget<'a> {
    limit: &'a Limit,
    measure: Measure,
    quota: &'a Quota,
    /// The key as the record and messages show it (`bytes_up`: `KEY@HOST`).
    display: String,
    store_key: String,
    cap: i64,
    /// The reservation first asked for (a retry after waiting asks for it again).
    amount: u64,
    delta: i64,
    window_end: SystemTime,
    ttl_until: SystemTime,
    /// A `queue` lets a reservation that does not fit only because of requests in flight
    /// wait for them until then.
    deadline: Option<Instant>,
    /// A streamed upload of unknown length: it reserves a block at a time.
    streamed: bool,
}

impl Limiter {
    /// Admits a request under `limits`, or refuses it. Nothing is charged on a refusal.
    pub async fn admit(
        self: &Arc<Self>,
        limits: &[&Limit],
        who: Subject<'_>,
        estimate: &Estimate,
    ) -> Result<Admission, Box<Refused>> {
        let started = Instant::now();
        let mut admission = Admission {
            limiter: self.clone(),
            head_up: estimate.head_up,
            held: Vec::new(),
            slots: Vec::new(),
            charges: Vec::new(),
            rate: None,
            upload: None,
            llm: estimate.llm.clone(),
            settled: false,
        };
        let now = SystemTime::now();
        // Buckets and slots first: a request refused for its rate reserves nothing.
        for limit in limits {
            let key = subject_key(limit.per, &who);
            if let Some(rate) = &limit.requests {
                let checked = self
                    .take_request(&mut admission, limit, rate, &key, now)
                    .await?;
                if !checked {
                    // The store cannot answer and the limit allows that: nothing more of
                    // this limit is asked of it.
                    continue;
                }
            }
            if let Some(conc) = &limit.concurrency {
                self.take_slot(&mut admission, limit, conc, &key, who.request_id)
                    .await?;
            }
        }
        // Budgets: reserve the estimate in the current window.
        let mut uploads = Vec::new();
        for limit in limits {
            let key = subject_key(limit.per, &who);
            let ask = Ask {
                key: &key,
                host: who.host,
                estimate,
                now,
                started,
            };
            for (measure, quota, amount) in budgets_of(limit, estimate) {
                let (Some(quota), Some(amount)) = (quota, amount) else {
                    continue;
                };
                if let Some(refused) = unpriced(&mut admission, limit, measure, quota, &ask) {
                    return Err(refused);
                }
                let budget = Budget::new(limit, measure, quota, amount, &ask);
                self.reserve_budget(&mut admission, &mut uploads, &budget, estimate.head_up)
                    .await?;
            }
        }
        if !uploads.is_empty() {
            admission.upload = Some(Arc::new(Upload {
                limiter: self.clone(),
                budgets: uploads,
                // The head goes first: it is sent (and charged) with the reservation.
                sent: AtomicU64::new(estimate.head_up),
                cut: Mutex::new(None),
            }));
        }
        Ok(admission)
    }

    /// One token from the request bucket of `limit`; a bucket that is empty refuses. `false`:
    /// the store could not answer and the limit lets the request on unchecked.
    async fn take_request(
        &self,
        admission: &mut Admission,
        limit: &Limit,
        rate: &crate::policy::limits::Rate,
        key: &str,
        now: SystemTime,
    ) -> Result<bool, Box<Refused>> {
        let store_key = store_key(&limit.name, "requests", key);
        let burst = u64::from(rate.count);
        let taken = self.take(&store_key, burst, rate.interval()).await;
        let mut charge = charge(limit, Measure::Requests, key, 1, 0, burst);
        let t = match taken {
            Ok(t) => t,
            Err(e) => {
                let c = admission.store_failed(limit, charge, &e)?;
                admission.charges.push(c);
                return Ok(false);
            }
        };
        charge.used = burst - t.remaining.min(burst);
        let headers = RateHeaders {
            limit: burst,
            remaining: t.remaining,
            reset: ceil_secs(t.reset_after),
        };
        if admission
            .rate
            .is_none_or(|r| headers.remaining < r.remaining)
        {
            admission.rate = Some(headers);
        }
        self.note(&charge, Some(now + t.reset_after), Some(&store_key));
        if !t.allowed {
            charge.refused = true;
            admission.charges.push(charge);
            let retry = ceil_secs(t.retry_after).max(1);
            return Err(admission.refuse_now(
                Reason::RateLimited,
                format!(
                    "limit {:?}: {} requests/{} for {key} used up; retry in {retry}s",
                    limit.name,
                    rate.count,
                    rate.period.as_str()
                ),
                Some(retry),
            ));
        }
        admission.charges.push(charge);
        Ok(true)
    }

    /// A concurrency slot of `limit` (waiting up to its `queue`); none free in time refuses.
    async fn take_slot(
        &self,
        admission: &mut Admission,
        limit: &Limit,
        conc: &crate::policy::limits::Concurrency,
        key: &str,
        request_id: &str,
    ) -> Result<(), Box<Refused>> {
        let store_key = store_key(&limit.name, "concurrency", key);
        let max = u64::from(conc.max);
        let mut charge = charge(limit, Measure::Concurrency, key, 1, 0, max);
        match self
            .slot(&store_key, request_id, conc.max, conc.queue)
            .await
        {
            Ok(Some((slot, in_use))) => {
                charge.used = in_use;
                admission.slots.push(slot);
                self.note(&charge, None, Some(&store_key));
            }
            Ok(None) => {
                charge.refused = true;
                charge.used = max;
                admission.charges.push(charge);
                return Err(admission.refuse_now(
                    Reason::RateLimited,
                    format!(
                        "limit {:?}: {} requests in flight for {key}, its concurrency cap; no slot came free within {}",
                        limit.name,
                        conc.max,
                        humantime::format_duration(conc.queue)
                    ),
                    Some(1),
                ));
            }
            Err(e) => {
                let c = admission.store_failed(limit, charge, &e)?;
                admission.charges.push(c);
                return Ok(());
            }
        }
        admission.charges.push(charge);
        Ok(())
    }

    /// Reserves `amount` against one budget, or refuses (used up, or held by requests in
    /// flight); a reservation made is held by the admission (and, streamed, by its upload).
    async fn reserve_budget(
        &self,
        admission: &mut Admission,
        uploads: &mut Vec<UploadBudget>,
        budget: &Budget<'_>,
        head_up: u64,
    ) -> Result<(), Box<Refused>> {
        let mut amount = budget.amount;
        let limit = budget.limit;
        let measure = budget.measure;
        let added = self.reserve_waiting(budget, &mut amount, head_up).await;
        let mut charge = charge(
            limit,
            measure,
            &budget.display,
            amount,
            0,
            budget.quota.amount,
        );
        match added {
            Ok(Added::Ok(v)) => {
                charge.used = v.max(0) as u64;
                self.note(&charge, Some(budget.window_end), Some(&budget.store_key));
                admission.held.push(Held {
                    limit: limit.name.clone(),
                    measure,
                    store_key: budget.store_key.clone(),
                    charge: admission.charges.len(),
                    reserved: amount,
                    ttl_until: budget.ttl_until,
                    upload: budget.streamed.then_some(uploads.len()),
                });
                if budget.streamed {
                    uploads.push(UploadBudget {
                        store_key: budget.store_key.clone(),
                        limit: limit.name.clone(),
                        display: budget.display.clone(),
                        cap: budget.quota.amount,
                        ttl_until: budget.ttl_until,
                        reserved: AtomicU64::new(amount),
                    });
                }
            }
            Ok(Added::Over(v)) => {
                charge.used = v.max(0) as u64;
                charge.refused = true;
                self.note(&charge, Some(budget.window_end), Some(&budget.store_key));
                admission.charges.push(charge);
                return Err(self.over_budget(admission, budget, v, amount));
            }
            Err(e) => {
                let c = admission.store_failed(limit, charge, &e)?;
                admission.charges.push(c);
                return Ok(());
            }
        }
        admission.charges.push(charge);
        Ok(())
    }

    /// Reserves `amount` in the budget's window. A streamed upload takes what is left of its
    /// block rather than nothing (but at least its head); with a `queue`, a reservation that
    /// does not fit only because of others in flight waits for them to settle (until the
    /// queue's time is up). `amount` ends as what was asked for last.
    async fn reserve_waiting(
        &self,
        budget: &Budget<'_>,
        amount: &mut u64,
        head_up: u64,
    ) -> Result<Added, StateError> {
        let (key, cap, ttl_until) = (&budget.store_key, budget.cap, budget.ttl_until);
        let mut added = self.reserve(key, budget.delta, cap, ttl_until).await;
        loop {
            if let (true, Ok(Added::Over(current))) = (budget.streamed, &added) {
                let left = cap.saturating_sub(*current);
                if left > 0 && left as u64 >= head_up {
                    *amount = left as u64;
                    added = self.reserve(key, left, cap, ttl_until).await;
                }
            }
            let waiting = match (&added, budget.deadline) {
                (Ok(Added::Over(v)), Some(d)) => {
                    Instant::now() < d && self.held_in_flight(key, *v, *amount, cap)
                }
                _ => false,
            };
            if !waiting {
                return added;
            }
            self.wait_settle(budget.deadline.unwrap_or_else(Instant::now))
                .await;
            added = self.reserve(key, budget.delta, cap, ttl_until).await;
        }
    }

    /// The refusal of a reservation that does not fit (`used` taken already): held by requests
    /// still in flight, or the budget used up for its window.
    fn over_budget(
        &self,
        admission: &mut Admission,
        budget: &Budget<'_>,
        used: i64,
        amount: u64,
    ) -> Box<Refused> {
        let (limit, measure, quota) = (budget.limit, budget.measure, budget.quota);
        let display = &budget.display;
        if self.held_in_flight(&budget.store_key, used, amount, budget.cap) {
            let inflight = self.inflight_of(&budget.store_key);
            return admission.refuse_now(
                Reason::BudgetReserved,
                format!(
                    "limit {:?}: {} budget for {display} has {} of {} {} taken this {}, {} of it reserved by requests still in flight; this request needs {}, which fits once they settle; retry in a moment{}",
                    limit.name,
                    measure.as_str(),
                    shown(measure, used.max(0) as u64),
                    shown(measure, quota.amount),
                    unit(measure),
                    quota.period.as_str(),
                    shown(measure, inflight),
                    shown(measure, amount),
                    if budget.deadline.is_some() { " (its queue time ran out)" } else { " (or give the limit a queue to wait for them)" }
                ),
                Some(1),
            );
        }
        let retry = budget
            .window_end
            .duration_since(SystemTime::now())
            .map_or(1, |d| ceil_secs(d).max(1));
        admission.refuse_now(
            Reason::BudgetExhausted,
            format!(
                "limit {:?}: {} budget for {display} has {} of {} {} used this {}; this request needs {}; it resets at {}",
                limit.name,
                measure.as_str(),
                shown(measure, used.max(0) as u64),
                shown(measure, quota.amount),
                unit(measure),
                quota.period.as_str(),
                shown(measure, amount),
                humantime::format_rfc3339_seconds(budget.window_end)
            ),
            Some(retry),
        )
    }
}

impl<'a> Budget<'a> {
    /// The budget of `measure` under `limit` for the request asking, in the window its start
    /// falls in; `amount` is the estimate (a streamed upload asks for a block instead).
    fn new(
        limit: &'a Limit,
        measure: Measure,
        quota: &'a Quota,
        amount: u64,
        ask: &Ask<'_>,
    ) -> Budget<'a> {
        let display = match measure {
            Measure::BytesUp => format!("{}@{}", ask.key, ask.host),
            _ => ask.key.to_string(),
        };
        let streamed = measure == Measure::BytesUp && ask.estimate.bytes_up.is_none();
        let amount = if streamed {
            ask.estimate
                .head_up
                .saturating_add(upload_block(quota.amount))
        } else {
            amount
        };
        let (start, end) = quota.period.window(ask.now);
        let mut store_key = store_key(&limit.name, measure.as_str(), &display);
        store_key.push(':');
        store_key.push_str(itoa::Buffer::new().format(start));
        let window_end = SystemTime::UNIX_EPOCH + Duration::from_secs(end);
        Budget {
            limit,
            measure,
            quota,
            display,
            store_key,
            cap: i64::try_from(quota.amount).unwrap_or(i64::MAX),
            amount,
            delta: i64::try_from(amount).unwrap_or(i64::MAX),
            window_end,
            ttl_until: window_end + WINDOW_SLACK,
            deadline: limit
                .concurrency
                .as_ref()
                .filter(|c| !c.queue.is_zero())
                .map(|c| ask.started + c.queue),
            streamed,
        }
    }
}

impl Admission {
    /// A refusal now: everything taken so far is given back.
    fn refuse_now(
        &mut self,
        reason: Reason,
        message: String,
        retry_after: Option<u64>,
    ) -> Box<Refused> {
        std::mem::replace(self, Admission::empty(self.limiter.clone())).refuse(
            reason,
            message,
            retry_after,
        )
    }
}

/// The budgets a limit has and what the estimate reserves against each (`None`: nothing to
/// reserve for this request).
fn budgets_of<'a>(
    limit: &'a Limit,
    estimate: &Estimate,
) -> [(Measure, Option<&'a Quota>, Option<u64>); 3] {
    [
        (
            Measure::BytesUp,
            limit.bytes_up.as_ref(),
            Some(
                estimate
                    .head_up
                    .saturating_add(estimate.bytes_up.unwrap_or(0)),
            ),
        ),
        (
            Measure::LlmTokens,
            limit.llm_tokens.as_ref(),
            estimate.llm.as_ref().map(|l| l.tokens),
        ),
        (
            Measure::Spend,
            limit.spend.as_ref(),
            estimate.llm.as_ref().map(|l| l.cost_micros.unwrap_or(0)),
        ),
    ]
}

/// A `spend` budget cannot count a model without a price: the request is refused.
fn unpriced(
    admission: &mut Admission,
    limit: &Limit,
    measure: Measure,
    quota: &Quota,
    ask: &Ask<'_>,
) -> Option<Box<Refused>> {
    if measure != Measure::Spend {
        return None;
    }
    let llm = ask
        .estimate
        .llm
        .as_ref()
        .filter(|l| l.cost_micros.is_none())?;
    let model = llm.model.as_deref().unwrap_or("(none named)");
    let c = charge(limit, measure, ask.key, 0, 0, quota.amount);
    admission.charges.push(LimitCharge { refused: true, ..c });
    Some(admission.refuse_now(
        Reason::BudgetExhausted,
        format!(
            "limit {:?}: model {model:?} has no price in the price table, so its spend cannot be counted against {} USD/{}; price it with [prices.\"MODEL\"]",
            limit.name,
            crate::policy::limits::format_usd(quota.amount),
            quota.period.as_str()
        ),
        None,
    ))
}
