// The burn-down chart, drawn as SVG: the minutes remaining through the period (from hourly usage), the
// even pace that would spend the budget exactly by the period's end, and the forecast from now at the
// recent burn rate. Unlimited namespaces show cumulative use instead.

import { s, h } from "./dom.js";
import { gpuMinutes, shortDate, shortTime, dateTime } from "./format.js";

const WIDTH = 760;
const HEIGHT = 300;
const MARGIN = { left: 72, right: 20, top: 16, bottom: 40 };
const HOUR = 3600 * 1000;

function niceStep(span, count) {
  const raw = span / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const unit = raw / power;
  return (unit <= 1 ? 1 : unit <= 2 ? 2 : unit <= 5 ? 5 : 10) * power;
}

function scale(domainMin, domainMax, rangeMin, rangeMax) {
  const span = domainMax - domainMin || 1;
  return (value) => rangeMin + ((value - domainMin) / span) * (rangeMax - rangeMin);
}

function pathOf(points, x, y) {
  return points.map(([t, v], i) => `${i ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join("");
}

/** Cumulative minutes used from the period's start until now: flat through idle hours, rising through
 * each hour that used some (a point at the hour's start and one at its end). */
export function cumulative(hourRows, start, now) {
  const rows = hourRows.slice().sort((a, b) => a.key.localeCompare(b.key));
  const points = [[start, 0]];
  let total = 0;
  for (const row of rows) {
    const from = Math.max(new Date(row.key).getTime(), start);
    if (from > points[points.length - 1][0]) points.push([from, total]);
    total += row.gpu_minutes;
    points.push([Math.max(Math.min(from + HOUR, now), from), total]);
  }
  if (points[points.length - 1][0] < now) points.push([now, total]);
  return points;
}

export function burnDown(budget, usage, nowIso) {
  const now = new Date(nowIso).getTime();
  const firstHour = usage.rows.length ? Math.min(...usage.rows.map((r) => new Date(r.key).getTime())) : now;
  const start = budget.period.start ? new Date(budget.period.start).getTime() : Math.min(firstHour, now - 24 * HOUR);
  const end = budget.period.end ? new Date(budget.period.end).getTime() : now + Math.max((now - start) / 4, HOUR);
  const used = cumulative(usage.rows, start, now);
  const unlimited = budget.budget_gpu_minutes === null;
  const allowance = unlimited ? null : budget.budget_gpu_minutes + budget.granted_gpu_minutes;
  const series = unlimited ? used : used.map(([t, v]) => [t, allowance - v]);
  const current = series[series.length - 1][1];

  let forecast = null;
  const rate = budget.forecast ? budget.forecast.burn_rate_gpu_minutes_per_hour : null;
  // From now while minutes remain: to the forecast exhaustion, or to the period's end when they last.
  if (!unlimited && rate && rate > 0 && now < end && current > 0) {
    const exhausts = budget.forecast.exhausts_at ? new Date(budget.forecast.exhausts_at).getTime() : null;
    const until = exhausts !== null && exhausts <= end ? exhausts : end;
    forecast = [
      [now, current],
      [until, current - (rate * (until - now)) / HOUR],
    ];
  }
  const pace = !unlimited && budget.period.end ? [[start, allowance], [end, 0]] : null;

  const values = [...series, ...(forecast || []), ...(pace || [])].map(([, v]) => v);
  let low = Math.min(0, ...values);
  let high = Math.max(unlimited ? 0 : allowance, ...values);
  if (high === low) high = low + 1;
  const step = niceStep(high - low, 5);
  low = Math.floor(low / step) * step;
  high = Math.ceil(high / step) * step;

  const x = scale(start, end, MARGIN.left, WIDTH - MARGIN.right);
  const y = scale(low, high, HEIGHT - MARGIN.bottom, MARGIN.top);
  const title = unlimited ? "Cumulative GPU-minutes used this period" : "GPU-minutes remaining this period";
  let description = unlimited
    ? `Unlimited budget; ${gpuMinutes(current)} GPU-minutes used since ${dateTime(start)}.`
    : `${gpuMinutes(current)} of ${gpuMinutes(allowance)} GPU-minutes remain (budget plus grants).`;
  if (forecast) {
    description += budget.forecast.exhausts_at
      ? ` At ${gpuMinutes(rate)} GPU-minutes an hour it runs out ${dateTime(budget.forecast.exhausts_at)}.`
      : ` At ${gpuMinutes(rate)} GPU-minutes an hour it lasts the period.`;
  }

  const grid = [];
  const steps = Math.round((high - low) / step);
  for (let k = 0; k <= steps; k += 1) {
    const v = Math.round((low + k * step) / step) * step || 0; // no -0, no 1e-13
    grid.push(
      s("line", { class: v === 0 ? "zero" : "grid", x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y(v), y2: y(v) }),
      s("text", { class: "tick", x: MARGIN.left - 8, y: y(v) + 4, "text-anchor": "end" }, gpuMinutes(v)),
    );
  }
  const days = (end - start) / (24 * HOUR);
  for (let i = 0; i <= 6; i += 1) {
    const t = start + ((end - start) * i) / 6;
    const label = days > 2 ? shortDate(new Date(t)) : shortTime(new Date(t));
    grid.push(
      s("text", { class: "tick", x: x(t), y: HEIGHT - MARGIN.bottom + 18, "text-anchor": "middle" }, label),
    );
  }

  const svg = s(
    "svg",
    {
      id: "burn-down",
      class: "chart",
      viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
      role: "img",
      "aria-labelledby": "burn-down-title burn-down-desc",
      dataset: { points: String(series.length), forecast: forecast ? "yes" : "no" },
    },
    s("title", { id: "burn-down-title" }, title),
    s("desc", { id: "burn-down-desc" }, description),
    ...grid,
    s("line", { class: "now", x1: x(now), x2: x(now), y1: MARGIN.top, y2: HEIGHT - MARGIN.bottom }),
    pace && s("path", { class: "series pace", d: pathOf(pace, x, y) }),
    forecast && s("path", { class: "series forecast", d: pathOf(forecast, x, y) }),
    s("path", { class: "series actual", d: pathOf(series, x, y) }),
  );

  const legend = h(
    "ul",
    { class: "legend" },
    h("li", {}, h("span", { class: "key actual", "aria-hidden": "true" }), unlimited ? "Used" : "Remaining"),
    pace && h("li", {}, h("span", { class: "key pace", "aria-hidden": "true" }), "Even pace to the period's end"),
    forecast && h("li", {}, h("span", { class: "key forecast", "aria-hidden": "true" }), "Forecast at the recent burn rate"),
    h("li", {}, h("span", { class: "key now", "aria-hidden": "true" }), "Now"),
  );
  return h("figure", { class: "chart-figure" }, svg, legend, h("figcaption", { class: "muted" }, description));
}
