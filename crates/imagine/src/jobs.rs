//! The worker's queue: fair between users (each user's jobs in order, the users taking turns,
//! one whose job just started going to the back), bounded, each waiting job told its position
//! whenever it changes; and the state of every job, finished ones kept a while for
//! [`ImageWorker::state`](crate::ImageWorker::state).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::error::Result;
use crate::pipeline::ImageParams;
use crate::worker::GeneratedImage;

/// How many finished jobs' states are kept.
const FINISHED_KEPT: usize = 256;

/// What a job's owner hears while it waits and runs (the image itself comes on its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEvent {
    /// How many jobs will start before this one (0: it is next); sent when it changes.
    Queued { position: usize },
    /// A denoising step is done, with a small PNG decoded from the latents when asked.
    Step {
        step: usize,
        steps: usize,
        preview: Option<Vec<u8>>,
    },
}

/// Where a job stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    Queued { position: usize },
    Running { step: usize, steps: usize },
    Completed,
    Cancelled,
    Failed(String),
}

impl JobState {
    /// Whether the job is over.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Cancelled | JobState::Failed(_)
        )
    }
}

/// A request for an image: whose it is (for fairness), what to draw, and how often to send a
/// preview (every `preview_every` steps; 0: never).
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub user: String,
    pub params: ImageParams,
    pub preview_every: usize,
}

/// A queued job.
pub(crate) struct Job {
    pub id: String,
    pub spec: JobSpec,
    pub events: mpsc::UnboundedSender<JobEvent>,
    pub reply: oneshot::Sender<Result<GeneratedImage>>,
    pub cancel: Arc<AtomicBool>,
    pub span: tracing::Span,
}

/// The waiting jobs by user in turn order, and every known job's state.
pub(crate) struct Queue {
    users: VecDeque<(String, VecDeque<Job>)>,
    waiting: usize,
    max: usize,
    states: HashMap<String, JobState>,
    finished: VecDeque<String>,
    /// The running job's id and stop flag.
    pub running: Option<(String, Arc<AtomicBool>)>,
    /// No handle is left: the worker ends once the queue is empty.
    pub closed: bool,
}

impl Queue {
    pub fn new(max: usize) -> Self {
        Queue {
            users: VecDeque::new(),
            waiting: 0,
            max: max.max(1),
            states: HashMap::new(),
            finished: VecDeque::new(),
            running: None,
            closed: false,
        }
    }

    /// Jobs waiting, all users together.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Queues `job` behind its user's others; false (the job dropped) when the queue is full.
    pub fn push(&mut self, job: Job) -> bool {
        if self.waiting >= self.max {
            return false;
        }
        self.waiting += 1;
        match self.users.iter_mut().find(|(u, _)| *u == job.spec.user) {
            Some((_, jobs)) => jobs.push_back(job),
            None => self
                .users
                .push_back((job.spec.user.clone(), VecDeque::from([job]))),
        }
        self.reposition();
        true
    }

    /// The next job: the first of the user whose turn it is; that user goes to the back.
    pub fn pop(&mut self) -> Option<Job> {
        let (user, mut jobs) = self.users.pop_front()?;
        let job = jobs.pop_front()?;
        self.waiting -= 1;
        if !jobs.is_empty() {
            self.users.push_back((user, jobs));
        }
        self.reposition();
        Some(job)
    }

    /// Takes the waiting job `id` out of the queue.
    pub fn remove(&mut self, id: &str) -> Option<Job> {
        let (u, i) = self
            .users
            .iter()
            .enumerate()
            .find_map(|(u, (_, jobs))| jobs.iter().position(|j| j.id == id).map(|i| (u, i)))?;
        let job = self.users[u].1.remove(i)?;
        if self.users[u].1.is_empty() {
            self.users.remove(u);
        }
        self.waiting -= 1;
        self.reposition();
        Some(job)
    }

    /// Every waiting job's position, in start order: the users take turns, one job each.
    fn order(&self) -> Vec<&Job> {
        let mut order = Vec::with_capacity(self.waiting);
        let rounds = self.users.iter().map(|(_, j)| j.len()).max().unwrap_or(0);
        for round in 0..rounds {
            order.extend(self.users.iter().filter_map(|(_, jobs)| jobs.get(round)));
        }
        order
    }

    /// Tells each waiting job whose position changed its new one.
    fn reposition(&mut self) {
        let moved: Vec<(String, usize, mpsc::UnboundedSender<JobEvent>)> = self
            .order()
            .into_iter()
            .enumerate()
            .filter(|(position, job)| {
                self.states.get(&job.id)
                    != Some(&JobState::Queued {
                        position: *position,
                    })
            })
            .map(|(position, job)| (job.id.clone(), position, job.events.clone()))
            .collect();
        for (id, position, events) in moved {
            let _ = events.send(JobEvent::Queued { position });
            self.states.insert(id, JobState::Queued { position });
        }
    }

    pub fn state(&self, id: &str) -> Option<JobState> {
        self.states.get(id).cloned()
    }

    /// Records `id`'s state; a final one is kept among the last [`FINISHED_KEPT`].
    pub fn set_state(&mut self, id: &str, state: JobState) {
        let done = state.is_final();
        self.states.insert(id.to_string(), state);
        if done {
            self.finished.push_back(id.to_string());
            while self.finished.len() > FINISHED_KEPT {
                if let Some(old) = self.finished.pop_front() {
                    self.states.remove(&old);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job of `user`, and what it hears.
    fn job(id: &str, user: &str) -> (Job, mpsc::UnboundedReceiver<JobEvent>) {
        let (events, heard) = mpsc::unbounded_channel();
        let (reply, _) = oneshot::channel();
        let params = ImageParams {
            prompt: "x".into(),
            negative_prompt: String::new(),
            seed: 0,
            steps: 1,
            width: 64,
            height: 64,
            guidance_scale: 0.0,
            init: None,
            loras: Vec::new(),
        };
        let spec = JobSpec {
            user: user.into(),
            params,
            preview_every: 0,
        };
        let job = Job {
            id: id.into(),
            spec,
            events,
            reply,
            cancel: Arc::new(AtomicBool::new(false)),
            span: tracing::Span::none(),
        };
        (job, heard)
    }

    fn places(heard: &mut mpsc::UnboundedReceiver<JobEvent>) -> Vec<usize> {
        std::iter::from_fn(|| heard.try_recv().ok())
            .map(|e| match e {
                JobEvent::Queued { position } => position,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn users_take_turns_and_each_job_hears_its_place_when_it_changes() {
        let mut q = Queue::new(8);
        let (a1, mut ha1) = job("a1", "ann");
        let (a2, mut ha2) = job("a2", "ann");
        let (a3, mut ha3) = job("a3", "ann");
        let (b1, mut hb1) = job("b1", "bob");
        for j in [a1, a2, a3, b1] {
            assert!(q.push(j));
        }
        // Ann's first, then Bob's, then Ann's others: one job each in turn. Bob's, come last,
        // goes second, and Ann's later ones move back for it.
        assert_eq!(places(&mut ha1), vec![0]);
        assert_eq!(places(&mut ha2), vec![1, 2]);
        assert_eq!(places(&mut ha3), vec![2, 3]);
        assert_eq!(places(&mut hb1), vec![1]);
        let order: Vec<String> = std::iter::from_fn(|| q.pop().map(|j| j.id)).collect();
        assert_eq!(order, ["a1", "b1", "a2", "a3"]);
        assert_eq!(places(&mut hb1), vec![0]);
        assert_eq!(places(&mut ha3), vec![2, 1, 0]);
        assert_eq!(q.waiting(), 0);
    }

    #[test]
    fn a_full_queue_refuses_and_a_removed_job_moves_the_others_up() {
        let mut q = Queue::new(2);
        let (a, _) = job("a", "ann");
        let (b, mut hb) = job("b", "ann");
        let (c, _) = job("c", "ann");
        assert!(q.push(a) && q.push(b));
        assert!(!q.push(c), "full");
        assert!(q.remove("a").is_some());
        assert!(q.remove("a").is_none());
        assert_eq!(places(&mut hb), vec![1, 0]);
        assert_eq!(q.state("b"), Some(JobState::Queued { position: 0 }));
    }

    #[test]
    fn finished_states_are_kept_a_while() {
        let mut q = Queue::new(1);
        for i in 0..FINISHED_KEPT + 10 {
            q.set_state(&i.to_string(), JobState::Completed);
        }
        assert_eq!(q.state("0"), None);
        assert_eq!(
            q.state(&(FINISHED_KEPT + 9).to_string()),
            Some(JobState::Completed)
        );
    }
}
