//! The α–β fit's solver: weighted least squares with every unknown non-negative, on the fit's five
//! columns (α, β below and from a protocol switch, γ, memory's extra), by trying every subset.

/// The fit's unknowns: α, β below and from the switch, γ, memory's extra.
pub const COLUMNS: usize = 5;

pub fn dot(a: &[f64; COLUMNS], b: &[f64; COLUMNS]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// Weighted least squares of `rows · x = 1` with every x ≥ 0: the unconstrained solution on
/// each subset of the columns, the best one with none negative (five columns: 31 subsets).
pub fn nonnegative_least_squares(rows: &[[f64; COLUMNS]], weights: &[f64]) -> [f64; COLUMNS] {
    let mut best = ([0.0; COLUMNS], f64::INFINITY);
    for subset in 1u8..(1 << COLUMNS) {
        let cols: Vec<usize> = (0..COLUMNS).filter(|c| subset >> c & 1 == 1).collect();
        let Some(solution) = solve_normal(rows, weights, &cols) else {
            continue;
        };
        if solution.iter().any(|v| *v < 0.0) {
            continue;
        }
        let mut x = [0.0; COLUMNS];
        for (c, v) in cols.iter().zip(&solution) {
            x[*c] = *v;
        }
        let cost: f64 = rows
            .iter()
            .zip(weights)
            .map(|(u, w)| w * (1.0 - dot(u, &x)).powi(2))
            .sum();
        if cost < best.1 {
            best = (x, cost);
        }
    }
    best.0
}

/// The normal equations of the weighted fit on columns `cols`, solved by Gaussian elimination
/// with partial pivoting; `None` if they are singular.
fn solve_normal(rows: &[[f64; COLUMNS]], weights: &[f64], cols: &[usize]) -> Option<Vec<f64>> {
    let k = cols.len();
    let mut a = vec![vec![0.0; k + 1]; k];
    for (u, w) in rows.iter().zip(weights) {
        for i in 0..k {
            for j in 0..k {
                a[i][j] += w * u[cols[i]] * u[cols[j]];
            }
            a[i][k] += w * u[cols[i]];
        }
    }
    for i in 0..k {
        let pivot = (i..k).max_by(|&p, &q| a[p][i].abs().total_cmp(&a[q][i].abs()))?;
        a.swap(i, pivot);
        if a[i][i].abs() < 1e-300 {
            return None;
        }
        let pivot_row = a[i].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != i {
                let f = row[i] / pivot_row[i];
                for (cell, p) in row.iter_mut().zip(&pivot_row).skip(i) {
                    *cell -= f * p;
                }
            }
        }
    }
    Some((0..k).map(|i| a[i][k] / a[i][i]).collect())
}
