// Numbers and times as people read them, in the browser's locale and time zone.

const minutes = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });
const precise = new Intl.NumberFormat(undefined, { maximumFractionDigits: 3 });
const percent = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const when = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "short" });
const day = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric" });
const hourOfDay = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });

export const STATE_LABELS = {
  in_budget: "In budget",
  warning: "Warning",
  exhausted: "Exhausted",
  unlimited: "Unlimited",
};

/** A budget's models whose own budget is spent, sorted ([] without model budgets). */
export function exhaustedModels(budget) {
  return Object.entries(budget.models || {})
    .filter(([, figures]) => figures.state === "exhausted")
    .map(([model]) => model)
    .sort();
}

// What the list calls the timekeeper's own cluster beside a fleet's members (no member's name has a blank).
export const LOCAL_CLUSTER = "local cluster";

/** Where a listed namespace is: its cluster ("" for the timekeeper's own) and its bare name, as every
 * answer that names a namespace gives them (`cluster` null for the local cluster). */
export function placeOf(ns) {
  return { cluster: ns.cluster ?? "", name: ns.namespace };
}

export function gpuMinutes(value) {
  if (value === null || value === undefined) return "—";
  return Math.abs(value) < 10 && value !== 0 ? precise.format(value) : minutes.format(value);
}

export function pct(value) {
  return value === null || value === undefined ? "—" : `${percent.format(value)} %`;
}

export function bytes(value) {
  if (value === null || value === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let size = value;
  let unit = 0;
  while (size >= 1024 && unit < units.length - 1) {
    size /= 1024;
    unit += 1;
  }
  return `${minutes.format(size)} ${units[unit]}`;
}

export function joules(value) {
  if (value === null || value === undefined) return "—";
  return value >= 3.6e6 ? `${precise.format(value / 3.6e6)} kWh` : `${minutes.format(value)} J`;
}

export function dateTime(value) {
  return value ? when.format(new Date(value)) : "—";
}

export function shortDate(date) {
  return day.format(date);
}

export function shortTime(date) {
  return hourOfDay.format(date);
}

/** "in 3 d 4 h", "in 25 min", "2 h ago". */
export function relative(value, now = Date.now()) {
  if (!value) return "—";
  const diff = new Date(value).getTime() - now;
  const abs = Math.abs(diff) / 60000;
  let text;
  if (abs < 1) text = "under a minute";
  else if (abs < 60) text = `${Math.round(abs)} min`;
  else if (abs < 48 * 60) text = `${Math.floor(abs / 60)} h ${Math.round(abs % 60)} min`;
  else text = `${Math.floor(abs / 1440)} d ${Math.round((abs % 1440) / 60)} h`;
  return diff >= 0 ? `in ${text}` : `${text} ago`;
}
