// A small Markdown renderer for the chat page (written for genai; MIT like the package).
// Renders the subset chat models write: fenced code blocks (also unterminated ones, while a
// reply streams), headings, lists, block quotes, tables, rules, paragraphs; inline code, bold,
// italics, strike-through and http(s)/mailto links. Everything is HTML-escaped first: model
// output can never inject markup.
"use strict";

(function () {
  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const UNESCAPES = Object.fromEntries(Object.entries(ESCAPES).map(([c, e]) => [e, c]));

  function escapeHtml(text) {
    return text.replace(/[&<>"']/g, (c) => ESCAPES[c]);
  }

  // The inverse of escapeHtml (and only of it: other entities stay as written).
  function unescapeHtml(html) {
    return html.replace(/&(amp|lt|gt|quot|#39);/g, (e) => UNESCAPES[e]);
  }

  function safeUrl(url) {
    const trimmed = url.trim();
    return /^(https?:|mailto:)/i.test(trimmed) ? trimmed : null;
  }

  // Inline spans of one escaped-later line: code spans are cut out first so that nothing
  // inside them is formatted.
  function inline(text) {
    const parts = text.split(/(`+[^`]*?`+)/g);
    return parts
      .map((part, i) => {
        if (i % 2 === 1 && /^`+/.test(part)) {
          const ticks = part.match(/^`+/)[0].length;
          if (part.endsWith("`".repeat(ticks)) && part.length > 2 * ticks) {
            return "<code>" + escapeHtml(part.slice(ticks, -ticks).trim()) + "</code>";
          }
        }
        return spans(part);
      })
      .join("");
  }

  function spans(raw) {
    // Links become placeholders while emphasis is marked, so that no URL is reformatted.
    const links = [];
    let html = escapeHtml(raw.replace(/\u0000/g, "")).replace(/\[([^\]]+)\]\(([^)\s]+)\)/g, (all, label, url) => {
      const href = safeUrl(unescapeHtml(url)); // the URL as written, escaped once below
      if (!href) return all;
      links.push(
        `<a href="${escapeHtml(href)}" target="_blank" rel="noopener noreferrer">${emphasis(label)}</a>`
      );
      return `\u0000${links.length - 1}\u0000`;
    });
    html = emphasis(html);
    return html.replace(/\u0000(\d+)\u0000/g, (all, n) => links[Number(n)]);
  }

  function emphasis(html) {
    html = html.replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>");
    html = html.replace(/__(?=\S)([\s\S]*?\S)__/g, "<strong>$1</strong>");
    html = html.replace(/(^|[^*\w])\*(?=\S)([^*]*?\S)\*(?!\*)/g, "$1<em>$2</em>");
    html = html.replace(/(^|[^_\w])_(?=\S)([^_]*?\S)_(?![_\w])/g, "$1<em>$2</em>");
    return html.replace(/~~(?=\S)([\s\S]*?\S)~~/g, "<del>$1</del>");
  }

  function isTableRule(line) {
    return /^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$/.test(line);
  }

  function cells(line) {
    return line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());
  }

  function render(source) {
    const lines = source.replace(/\r\n?/g, "\n").split("\n");
    const out = [];
    let paragraph = [];
    let i = 0;

    const flush = () => {
      if (paragraph.length) {
        out.push("<p>" + paragraph.map(inline).join("<br>") + "</p>");
        paragraph = [];
      }
    };

    while (i < lines.length) {
      const line = lines[i];
      const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
      if (fence) {
        flush();
        const marker = fence[1];
        const body = [];
        i += 1;
        while (i < lines.length && !lines[i].trim().startsWith(marker)) {
          body.push(lines[i]);
          i += 1;
        }
        i += 1; // the closing fence (or the end of an unterminated block)
        const lang = fence[2] ? `<span class="lang">${escapeHtml(fence[2])}</span>` : "";
        const cls = fence[2] ? ` class="language-${escapeHtml(fence[2])}"` : "";
        out.push(`<pre>${lang}<code${cls}>${escapeHtml(body.join("\n"))}</code></pre>`);
        continue;
      }
      if (!line.trim()) {
        flush();
        i += 1;
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*?)\s*#*\s*$/);
      if (heading) {
        flush();
        const level = heading[1].length;
        out.push(`<h${level}>${inline(heading[2])}</h${level}>`);
        i += 1;
        continue;
      }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
        flush();
        out.push("<hr>");
        i += 1;
        continue;
      }
      if (/^\s*>/.test(line)) {
        flush();
        const quoted = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) {
          quoted.push(lines[i].replace(/^\s*>\s?/, ""));
          i += 1;
        }
        out.push("<blockquote>" + render(quoted.join("\n")) + "</blockquote>");
        continue;
      }
      if (line.includes("|") && i + 1 < lines.length && isTableRule(lines[i + 1])) {
        flush();
        const head = cells(line);
        i += 2;
        const rows = [];
        while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
          rows.push(cells(lines[i]));
          i += 1;
        }
        const th = head.map((c) => `<th>${inline(c)}</th>`).join("");
        const tb = rows
          .map((r) => "<tr>" + r.map((c) => `<td>${inline(c)}</td>`).join("") + "</tr>")
          .join("");
        out.push(`<table><thead><tr>${th}</tr></thead><tbody>${tb}</tbody></table>`);
        continue;
      }
      const item = line.match(/^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/);
      if (item) {
        flush();
        const ordered = /\d/.test(item[2]);
        const start = ordered ? parseInt(item[2], 10) : 1;
        const items = [];
        while (i < lines.length) {
          const m = lines[i].match(/^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/);
          if (m && /\d/.test(m[2]) === ordered) {
            items.push([m[3]]);
            i += 1;
          } else if (items.length && /^\s{2,}\S/.test(lines[i])) {
            items[items.length - 1].push(lines[i].trim()); // a continued or nested line
            i += 1;
          } else {
            break;
          }
        }
        const tag = ordered ? "ol" : "ul";
        const attr = ordered && start !== 1 ? ` start="${start}"` : "";
        const lis = items.map((parts) => "<li>" + parts.map(inline).join("<br>") + "</li>");
        out.push(`<${tag}${attr}>${lis.join("")}</${tag}>`);
        continue;
      }
      paragraph.push(line);
      i += 1;
    }
    flush();
    return out.join("\n");
  }

  window.GenaiMarkdown = { render, escapeHtml };
})();
