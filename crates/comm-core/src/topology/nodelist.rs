//! Slurm's compressed lists: host lists (`lrdn[0101-0104,0107]`) and task counts (`2(x3),1`), as
//! `SLURM_JOB_NODELIST` and `SLURM_TASKS_PER_NODE` give them. Pure text in, names and counts
//! out: no environment, no `scontrol`.

/// Reads Slurm's compressed task counts (`2(x3),1`) and returns the count on node `node`.
pub fn tasks_on_node(spec: &str, node: usize) -> Option<usize> {
    let mut seen = 0;
    for part in spec.split(',') {
        let (count, repeat) = match part.split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (part, 1),
        };
        let count = count.trim().parse::<usize>().ok()?;
        if node < seen + repeat {
            return Some(count);
        }
        seen += repeat;
    }
    None
}

/// The most hosts [`expand_nodelist`] lists: more than any job has, so more is a mistake (and
/// `r[1-100000]n[1-100000]` would otherwise allocate until the process dies).
pub const MAX_NODELIST_HOSTS: u64 = 65536;

/// Expands a Slurm host list such as `lrdn[0101-0104,0107]` or `a1,b[1-2]-ib` into host names, in
/// order, keeping zero padding. Refuses a list of more than [`MAX_NODELIST_HOSTS`] hosts (counted
/// before anything is expanded).
pub fn expand_nodelist(list: &str) -> std::result::Result<Vec<String>, String> {
    let items = parse_nodelist(list)?;
    let count = items
        .iter()
        .try_fold(0u64, |sum, parts| sum.checked_add(host_count(parts)?))
        .filter(|&n| n <= MAX_NODELIST_HOSTS)
        .ok_or_else(|| format!("names more than {MAX_NODELIST_HOSTS} hosts"))?;
    let mut hosts = Vec::with_capacity(count as usize);
    for parts in &items {
        expand_parts(parts, String::new(), &mut hosts);
    }
    Ok(hosts)
}

/// The first host of a Slurm host list (where rank 0 runs), without expanding the rest: the
/// whole list is checked, but `r[1-100000]n[1-100000]` costs no more than `r1n1`.
pub fn first_host(list: &str) -> std::result::Result<String, String> {
    let items = parse_nodelist(list)?;
    let mut host = String::new();
    for part in &items[0] {
        match part {
            HostPart::Text(text) => host.push_str(text),
            HostPart::Ranges(ranges) => {
                let (lo, _, width) = ranges[0];
                host.push_str(&format!("{lo:0width$}"));
            }
        }
    }
    Ok(host)
}

/// A piece of a host pattern: literal text, or a bracket's ranges (first, last, zero-padded
/// width).
enum HostPart {
    Text(String),
    Ranges(Vec<(u64, u64, usize)>),
}

/// Every host pattern of the list, checked (brackets, numbers, ranges that run forwards).
fn parse_nodelist(list: &str) -> std::result::Result<Vec<Vec<HostPart>>, String> {
    split_top_level(list)?
        .iter()
        .map(|item| {
            if item.is_empty() {
                Err("empty host name".to_string())
            } else {
                parse_host(item)
            }
        })
        .collect()
}

/// Splits on the commas that are not inside brackets.
fn split_top_level(list: &str) -> std::result::Result<Vec<String>, String> {
    let (mut items, mut current, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in list.trim().chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err("unbalanced or nested brackets".into());
        }
        current.push(c);
    }
    if depth != 0 {
        return Err("unbalanced brackets".into());
    }
    items.push(current);
    Ok(items)
}

/// One host pattern's pieces; several bracket groups multiply (`r[1-2]n[1-2]` is four hosts).
fn parse_host(pattern: &str) -> std::result::Result<Vec<HostPart>, String> {
    let mut parts = Vec::new();
    let mut rest = pattern;
    while let Some(open) = rest.find('[') {
        let close = open + rest[open..].find(']').ok_or("unbalanced brackets")?;
        if open > 0 {
            parts.push(HostPart::Text(rest[..open].to_string()));
        }
        let mut ranges = Vec::new();
        for range in rest[open + 1..close].split(',') {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            let (Ok(a), Ok(b)) = (lo.parse::<u64>(), hi.parse::<u64>()) else {
                return Err(format!("bad range {range:?}"));
            };
            if a > b {
                return Err(format!("range {range:?} runs backwards"));
            }
            ranges.push((a, b, lo.len()));
        }
        parts.push(HostPart::Ranges(ranges));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        parts.push(HostPart::Text(rest.to_string()));
    }
    Ok(parts)
}

/// How many hosts a pattern names; None past u64.
fn host_count(parts: &[HostPart]) -> Option<u64> {
    parts.iter().try_fold(1u64, |product, part| match part {
        HostPart::Text(_) => Some(product),
        HostPart::Ranges(ranges) => {
            let n = ranges.iter().try_fold(0u64, |sum, &(a, b, _)| {
                sum.checked_add((b - a).checked_add(1)?)
            })?;
            product.checked_mul(n)
        }
    })
}

/// Appends every host of `parts` to `hosts`, each starting with `head`, in order.
fn expand_parts(parts: &[HostPart], head: String, hosts: &mut Vec<String>) {
    match parts.split_first() {
        None => hosts.push(head),
        Some((HostPart::Text(text), rest)) => expand_parts(rest, head + text, hosts),
        Some((HostPart::Ranges(ranges), rest)) => {
            for &(a, b, width) in ranges {
                for n in a..=b {
                    expand_parts(rest, format!("{head}{n:0width$}"), hosts);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodelists() {
        assert_eq!(
            expand_nodelist("lrdn[0101-0104,0107]").unwrap(),
            ["lrdn0101", "lrdn0102", "lrdn0103", "lrdn0104", "lrdn0107"]
        );
        assert_eq!(expand_nodelist("node1").unwrap(), ["node1"]);
        assert_eq!(
            expand_nodelist("a1,b[8-10]-ib").unwrap(),
            ["a1", "b8-ib", "b9-ib", "b10-ib"]
        );
        assert_eq!(
            expand_nodelist("r[1-2]n[01-02]").unwrap(),
            ["r1n01", "r1n02", "r2n01", "r2n02"]
        );
        assert!(expand_nodelist("n[1-2").is_err());
        assert!(expand_nodelist("n[a-b]").is_err());
        assert!(expand_nodelist("a,,b").is_err());
    }

    #[test]
    fn task_counts() {
        assert_eq!(tasks_on_node("4", 0), Some(4));
        assert_eq!(tasks_on_node("2(x3),1", 2), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 3), Some(1));
        assert_eq!(tasks_on_node("2(x3),1", 4), None);
    }
}
