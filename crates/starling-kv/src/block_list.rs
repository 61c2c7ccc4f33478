//! Intrusive doubly linked lists of block indices over one shared link
//! arena: the pool's free list and its LRU of cached free blocks.
//!
//! Every block has one [`Link`] in the pool's arena; a block is on at most
//! one list at a time, so one pair of links per block serves all lists.
//! All operations are O(1); nothing allocates after construction.

use crate::error::KvError;

/// Sentinel for "no neighbour".
pub(crate) const NO_LINK: u32 = u32::MAX;

/// One block's neighbours on whichever list holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Link {
    prev: u32,
    next: u32,
}

impl Link {
    /// Off every list.
    pub(crate) const UNLINKED: Link = Link {
        prev: NO_LINK,
        next: NO_LINK,
    };
}

/// The ends and length of one list; the links live in the caller's arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockList {
    head: u32,
    tail: u32,
    len: usize,
}

impl BlockList {
    /// An empty list.
    pub(crate) fn new() -> Self {
        Self {
            head: NO_LINK,
            tail: NO_LINK,
            len: 0,
        }
    }

    /// A list of every index of `links` in ascending order (links rewritten).
    pub(crate) fn all_in_order(links: &mut [Link]) -> Self {
        let mut list = Self::new();
        for i in 0..links.len() as u32 {
            list.push_tail(links, i);
        }
        list
    }

    /// Entries on the list.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Removes and returns the head (the entry pushed longest ago).
    pub(crate) fn pop_head(&mut self, links: &mut [Link]) -> Option<u32> {
        let head = self.head;
        if head == NO_LINK {
            return None;
        }
        self.unlink(links, head);
        Some(head)
    }

    /// Appends `idx`, which must be on no list, at the tail.
    pub(crate) fn push_tail(&mut self, links: &mut [Link], idx: u32) {
        debug_assert_eq!(links[idx as usize], Link::UNLINKED, "{idx} already listed");
        let old_tail = self.tail;
        links[idx as usize] = Link {
            prev: old_tail,
            next: NO_LINK,
        };
        if old_tail == NO_LINK {
            self.head = idx;
        } else {
            links[old_tail as usize].next = idx;
        }
        self.tail = idx;
        self.len += 1;
    }

    /// Removes `idx`, which must be on this list.
    pub(crate) fn unlink(&mut self, links: &mut [Link], idx: u32) {
        let Link { prev, next } = links[idx as usize];
        if prev == NO_LINK {
            debug_assert_eq!(self.head, idx, "{idx} is not on this list");
            self.head = next;
        } else {
            links[prev as usize].next = next;
        }
        if next == NO_LINK {
            self.tail = prev;
        } else {
            links[next as usize].prev = prev;
        }
        links[idx as usize] = Link::UNLINKED;
        self.len -= 1;
    }

    /// The entries head to tail, after checking the list is well formed:
    /// symmetric links, no cycle, tail and length as recorded. For
    /// invariant checks (O(len)); `name` labels the list in errors.
    pub(crate) fn walk(&self, links: &[Link], name: &str) -> Result<Vec<u32>, KvError> {
        let fail = |msg: String| Err(KvError::InvariantViolated(format!("{name} list: {msg}")));
        let mut out = Vec::with_capacity(self.len);
        let mut prev = NO_LINK;
        let mut cur = self.head;
        while cur != NO_LINK {
            let Some(link) = links.get(cur as usize) else {
                return fail(format!("links to missing block {cur}"));
            };
            if out.len() >= links.len() {
                return fail(format!("cycle through block {cur}"));
            }
            if link.prev != prev {
                return fail(format!("block {cur}: prev link {} != {prev}", link.prev));
            }
            out.push(cur);
            prev = cur;
            cur = link.next;
        }
        if prev != self.tail {
            return fail(format!("tail {} but walk ended at {prev}", self.tail));
        }
        if out.len() != self.len {
            return fail(format!("{} entries, count says {}", out.len(), self.len));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_lists_share_one_arena() {
        let mut links = vec![Link::UNLINKED; 5];
        let mut a = BlockList::all_in_order(&mut links);
        let mut b = BlockList::new();
        a.unlink(&mut links, 2);
        b.push_tail(&mut links, 2);
        assert_eq!(a.pop_head(&mut links), Some(0));
        b.push_tail(&mut links, 0);
        a.unlink(&mut links, 4);
        assert_eq!(a.walk(&links, "a").unwrap(), vec![1, 3]);
        assert_eq!(b.walk(&links, "b").unwrap(), vec![2, 0]);
        assert_eq!((a.len(), b.len()), (2, 2));
        assert_eq!(links[4], Link::UNLINKED);
        assert_eq!(b.pop_head(&mut links), Some(2));
        assert_eq!(b.pop_head(&mut links), Some(0));
        assert_eq!(b.pop_head(&mut links), None);
        assert_eq!(b.walk(&links, "b").unwrap(), Vec::<u32>::new());
    }
}
