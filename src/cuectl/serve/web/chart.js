// A frame's GPU use over time on a <canvas>, drawn by hand (no chart library may load under
// the CSP, and this needs little): utilisation % on the left axis, memory (GB) on the
// right, one solid (util) and one dashed (memory) line per device, time since the first
// sample along the bottom. Colours come from CSS custom properties, so dark mode applies.

const GIB = 1024 ** 3;
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400];

function niceCeil(value) {
  if (value <= 0) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((v) => v >= value);
}

function timeLabel(seconds) {
  if (seconds < 60 || seconds % 60) return `${seconds}s`;
  if (seconds < 3600 || seconds % 3600) return `${seconds / 60}m`;
  return `${seconds / 3600}h`;
}

// A sample's time: ISO 8601 from the API ([time, util %, memory bytes]), as epoch seconds.
const seconds = (p) => (typeof p[0] === "string" ? Date.parse(p[0]) / 1000 : p[0]);

/** Draw ``samples`` ({uuid: [[t, util, mem], ...]}, as GET /frames/{id} returns them) with
 * devices in ``order`` (the frame's gpu_uuids). Returns a one-line summary for the
 * canvas's accessible label. */
export function drawUsage(canvas, samples, order = []) {
  const dpr = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 480;
  const height = canvas.clientHeight || 200;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, width, height);
  const css = getComputedStyle(canvas);
  const color = (name) => css.getPropertyValue(name).trim() || "gray";
  g.font = `12px ${css.fontFamily}`;

  const uuids = [...order.filter((u) => samples[u]), ...Object.keys(samples).filter((u) => !order.includes(u))];
  const series = uuids.map((u) => samples[u]).filter((points) => points && points.length);
  const all = series.flat();
  const pad = {left: 46, right: 54, top: 12, bottom: 38};
  const w = Math.max(10, width - pad.left - pad.right);
  const h = Math.max(10, height - pad.top - pad.bottom);

  const t0 = all.length ? Math.min(...all.map(seconds)) : 0;
  const span = all.length ? Math.max(1, Math.max(...all.map(seconds)) - t0) : 60;
  const memPeak = Math.max(0, ...all.map((p) => p[2] || 0)) / GIB;
  const memTop = niceCeil(memPeak || 1);
  const x = (t) => pad.left + ((t - t0) / span) * w;
  const yUtil = (u) => pad.top + h - (u / 100) * h;
  const yMem = (m) => pad.top + h - (m / GIB / memTop) * h;

  // Grid and both value axes: four steps each.
  g.lineWidth = 1;
  g.textBaseline = "middle";
  for (let i = 0; i <= 4; i++) {
    const y = Math.round(pad.top + h - (i / 4) * h) + 0.5;
    g.strokeStyle = color("--grid");
    g.beginPath();
    g.moveTo(pad.left, y);
    g.lineTo(pad.left + w, y);
    g.stroke();
    g.fillStyle = color("--muted");
    g.textAlign = "right";
    g.fillText(String(25 * i), pad.left - 6, y);
    g.textAlign = "left";
    g.fillText(String(+((memTop * i) / 4).toFixed(2)), pad.left + w + 6, y);
  }
  // Time axis: the smallest step that gives at most six ticks.
  const step = TIME_STEPS.find((s) => span / s <= 6) || 86400;
  g.textAlign = "center";
  g.textBaseline = "top";
  for (let s = 0; s <= span + 1e-9; s += step) g.fillText(timeLabel(s), x(t0 + s), pad.top + h + 5);

  // Axis titles.
  g.fillStyle = color("--fg");
  g.fillText("time since start", pad.left + w / 2, pad.top + h + 21);
  const vertical = (text, cx, fill) => {
    g.save();
    g.translate(cx, pad.top + h / 2);
    g.rotate(-Math.PI / 2);
    g.fillStyle = fill;
    g.textBaseline = "middle";
    g.fillText(text, 0, 0);
    g.restore();
  };
  vertical("GPU util %", 10, color("--util"));
  vertical("Memory (GB)", width - 8, color("--mem"));

  if (!series.length) {
    g.fillStyle = color("--muted");
    g.textBaseline = "middle";
    g.fillText("No GPU samples yet", pad.left + w / 2, pad.top + h / 2);
    return "no GPU samples yet";
  }
  // The lines; a null value breaks a line rather than dropping to zero.
  const line = (points, pick, y, stroke, dash) => {
    g.strokeStyle = stroke;
    g.lineWidth = 2;
    g.setLineDash(dash);
    g.beginPath();
    let pen = false;
    for (const p of points) {
      const v = pick(p);
      if (v === null || v === undefined) {
        pen = false;
        continue;
      }
      if (pen) g.lineTo(x(seconds(p)), y(v));
      else g.moveTo(x(seconds(p)), y(v));
      pen = true;
    }
    if (points.length === 1 && pen) g.lineTo(x(points[0][0]) + 2, y(pick(points[0]))); // one sample: a dot
    g.stroke();
    g.setLineDash([]);
  };
  series.forEach((points, i) => {
    const alpha = 1 - Math.min(0.6, i * 0.25); // several devices: the same hues, fainter
    g.globalAlpha = alpha;
    line(points, (p) => p[2], yMem, color("--mem"), [5, 3]);
    line(points, (p) => p[1], yUtil, color("--util"), []);
  });
  g.globalAlpha = 1;
  const utils = all.map((p) => p[1]).filter((u) => u !== null && u !== undefined);
  const peakUtil = utils.length ? Math.max(...utils) : null;
  return `${series.length} GPU(s) over ${Math.round(span)}s: peak utilisation ${peakUtil === null ? "unknown" : Math.round(peakUtil) + "%"}, peak memory ${memPeak.toFixed(1)} GB`;
}
